"""Protocol front-ends (protocol layer): each translates one wire protocol into namespace calls."""
