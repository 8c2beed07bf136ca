"""One reader for numeric environment variables: the default when unset, the value in range, a ValueError naming the variable."""
from __future__ import annotations

import pytest

from devices.environment import env_number

NAME = "KILN_TEST_NUMBER"


def test_an_unset_or_empty_variable_gives_the_default(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_number(NAME, 7, whole=True) == 7
    monkeypatch.setenv(NAME, "  ")
    assert env_number(NAME, None) is None
    monkeypatch.setenv(NAME, "0")
    assert env_number(NAME, 512, whole=True, low=256, unset=("", "0")) == 512


def test_a_value_in_range_is_read_as_its_type(monkeypatch):
    monkeypatch.setenv(NAME, " 2048 ")
    value = env_number(NAME, 4096, whole=True, low=256)
    assert value == 2048 and isinstance(value, int)
    monkeypatch.setenv(NAME, "0.9")
    assert env_number(NAME, 0.5, low=0.0, high=0.9) == pytest.approx(0.9)


@pytest.mark.parametrize(("raw", "kwargs", "message"), [
    ("lots", {"whole": True, "low": 256, "unit": "megabytes"}, "KILN_TEST_NUMBER must be a whole number of megabytes, at least 256, got 'lots'"),
    ("100", {"whole": True, "low": 256, "unit": "megabytes"}, "KILN_TEST_NUMBER must be a whole number of megabytes, at least 256, got 100"),
    ("1.5", {"whole": True, "low": 0, "high": 10}, "KILN_TEST_NUMBER must be a whole number from 0 to 10, got '1.5'"),
    ("11", {"whole": True, "low": 0, "high": 10}, "KILN_TEST_NUMBER must be a whole number from 0 to 10, got 11"),
    ("1.5", {"low": 0.0, "high": 0.9}, "KILN_TEST_NUMBER must be a number from 0 to 0.9, got 1.5"),
    ("-1", {"low": 0.0, "unit": "cores"}, "KILN_TEST_NUMBER must be a number of cores, at least 0, got -1"),
    ("nan", {"low": 0.0}, "KILN_TEST_NUMBER must be a number, at least 0, got nan"),
    ("99", {"high": 10}, "KILN_TEST_NUMBER must be a number, at most 10, got 99"),
])
def test_a_bad_value_raises_an_error_that_names_the_variable_and_what_it_takes(monkeypatch, raw, kwargs, message):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(ValueError) as raised:
        env_number(NAME, None, **kwargs)
    assert str(raised.value) == message
