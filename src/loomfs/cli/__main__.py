"""``python -m loomfs.cli``: the ``loomfs`` command."""

from . import main

main()
