"""cutlass_ops.warmup: argument checks and CPU layers (nothing to prepare) without a GPU."""
import pytest
import torch

import cutlass_ops
from cutlass_ops import WeightOnlyConfig


def _model():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    cutlass_ops.quantize_(model, WeightOnlyConfig(bits=4, block_size=32))
    return model


def test_cpu_layers_need_no_warmup():
    assert cutlass_ops.warmup(_model(), batch_sizes=(1, 16)) == 0


@pytest.mark.parametrize("bad", [(0,), (1.5,), (True,), ("4",)])
def test_batch_sizes_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match="batch_sizes"):
        cutlass_ops.warmup(_model(), batch_sizes=bad)


def test_dtype_must_be_a_float_type():
    with pytest.raises(ValueError, match="dtype"):
        cutlass_ops.warmup(_model(), dtype=torch.int8)
