"""``python -m loomfs``: the ``loomfs`` command (protocol layer)."""

from .cli import main

main(prog_name="loomfs")
