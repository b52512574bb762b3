"""The large real-data checks and ``../shared/data``: used when present; without it a skip
that says why, except in CI (which has the data), where it is a failure."""
import pytest

from tests.helpers import require_shared_data


def test_present_folder_is_returned(tmp_path):
    assert require_shared_data(str(tmp_path), {"CI": "true"}) == str(tmp_path)


@pytest.mark.parametrize("environ", [{}, {"CI": "false"}, {"CI": ""}])
def test_missing_folder_outside_ci_skips_with_the_reason(tmp_path, environ):
    missing = str(tmp_path / "shared" / "data")
    with pytest.raises(pytest.skip.Exception, match="needs ../shared/data") as info:
        require_shared_data(missing, environ)
    assert missing in str(info.value)


@pytest.mark.parametrize("value", ["true", "1", "True"])
def test_missing_folder_in_ci_is_a_failure(tmp_path, value):
    missing = str(tmp_path / "shared" / "data")
    with pytest.raises(pytest.fail.Exception, match="CI is set") as info:
        require_shared_data(missing, {"CI": value})
    assert missing in str(info.value)
