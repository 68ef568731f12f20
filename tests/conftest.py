import pytest

pytest_plugins = ["loomfs.testing.fixtures"]

# fsspec's abstract suite (tests/test_sdk.py::TestFsspecAbstractSuite) is 136 tests and takes
# minutes: make test runs one or two of each kind (these), the rest carry the
# ``fsspec_suite`` mark, which the default options deselect. The whole suite:
#   pytest -m "" tests/test_sdk.py::TestFsspecAbstractSuite
FSSPEC_REPRESENTATIVE = {
    "test_copy_file_to_file_in_new_directory",
    "test_copy_directory_to_existing_directory",
    "test_get_file_to_new_directory",
    "test_get_directory_recursive",
    "test_put_file_to_file_in_new_directory",
    "test_put_directory_recursive",
    "test_open_exclusive",
    "test_pipe_exclusive",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.nodeid.startswith("tests/test_sdk.py::TestFsspecAbstractSuite::"):
            continue
        if getattr(item, "originalname", item.name) not in FSSPEC_REPRESENTATIVE:
            item.add_marker(pytest.mark.fsspec_suite)
