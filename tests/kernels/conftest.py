import pytest

from radixlm import kernels


@pytest.fixture(scope="session")
def kernel_ops():
    """torch.ops.radixlm, built for this machine. CI machines have g++ and AVX2: a build failure
    is a test failure, never a skip."""
    assert kernels.available(), (
        f"native kernels failed to build/load: {kernels.unavailable_reason()}"
    )
    from radixlm.kernels.ops import ops

    return ops()
