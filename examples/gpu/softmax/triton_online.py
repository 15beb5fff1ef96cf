"""Row-wise softmax in two passes over column blocks (online max and sum, then the write):
any row width, one program per row, no row held whole in registers."""

import torch
import triton
import triton.language as tl


@triton.jit
def _online_softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_in = in_ptr + row * in_stride
    row_out = out_ptr + row * out_stride
    running_max = tl.full([BLOCK], -float("inf"), tl.float32)
    running_sum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_in + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(running_max, x)
        # lanes that have seen only padding keep -inf as their max: rescale them by 0, not NaN
        rescale = tl.where(new_max == -float("inf"), 0.0, tl.exp(running_max - new_max))
        running_sum = running_sum * rescale + tl.where(x == -float("inf"), 0.0, tl.exp(x - new_max))
        running_max = new_max
    row_max = tl.max(running_max, axis=0)
    lane_sums = tl.where(running_max == -float("inf"), 0.0, running_sum * tl.exp(running_max - row_max))
    row_sum = tl.sum(lane_sums, axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(row_in + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(row_out + cols, (tl.exp(x - row_max) / row_sum).to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x):
    rows, cols = x.shape
    out = torch.empty_like(x)
    block = min(1024, triton.next_power_of_2(cols))
    _online_softmax_kernel[(rows,)](out, x, x.stride(0), out.stride(0), cols, BLOCK=block, num_warps=4)
    return out
