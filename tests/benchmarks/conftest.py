"""The small real models the local search runs on: the same fixtures as the search's own tests."""

from tests.workers.conftest import digits_files  # noqa: F401
from tests.workers.quantize.conftest import mlp, mlp_files  # noqa: F401
