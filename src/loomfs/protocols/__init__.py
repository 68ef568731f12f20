"""Protocol front-ends (protocol layer): wire formats translated into namespace calls."""
