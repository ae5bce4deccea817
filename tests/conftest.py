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


FULL_TRACE_XZ = SHARED / "ds-zero3-offload-134m-bf16-gas2-h200.sqlite.xz"


@pytest.fixture(scope="session")
def full_trace(tmp_path_factory) -> Path:
    """The full shared DeepSpeed trace (624 MB), decompressed once per test session into a
    temporary folder; skips when ../shared is not beside the checkout."""
    import lzma
    import shutil

    if not FULL_TRACE_XZ.exists():
        pytest.skip("full shared trace not present")
    out = tmp_path_factory.mktemp("full") / "ds-zero3-offload-134m-bf16-gas2-h200.sqlite"
    with lzma.open(FULL_TRACE_XZ) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
    return out
