"""The Python SDK (protocol layer, client side): ``loomfs://`` for fsspec; the PyTorch
helpers are in ``loomfs.torch``."""
