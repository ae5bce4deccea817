import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # for tests/synthetic.py

FIXTURES = HERE / "fixtures"
ZERO3_CUT = FIXTURES / "ds_zero3_offload_iter1-2.sqlite"
# ../shared beside the checkout (read-only); tests that need it skip when it is absent
SHARED = HERE.parent.parent / "shared" / "traces"
PUBLIC = SHARED / "public"


@pytest.fixture
def zero3_cut() -> Path:
    return ZERO3_CUT


def public_exports():
    return sorted(PUBLIC.glob("*.sqlite")) if PUBLIC.exists() else []
