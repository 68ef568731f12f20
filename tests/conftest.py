pytest_plugins = ["loomfs.testing.fixtures"]
