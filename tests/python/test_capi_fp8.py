"""Stage 14's FP8 calls of the C ABI (fa_fp8_*, ABI version 3) through fa_course.capi, without a
GPU: the workspace sizes, the arguments refused before any GPU is asked for (each with its status and
a message that names the call), and, on a machine without a GPU (or without an H100/H200), one clear
refusal instead of a crash. Host buffers stand in for tensors: every call here is refused before
any is read. The GPU runs are tests/torch/test_fp8.py's."""

import array
import ctypes
import unittest

import _support
from fa_course import FaError, Problem, capi

PROBLEM = Problem(1, 4, 2, 100, 130, 80, causal=True)  # grouped, Nq != Nk, D = 80 (Dpad 128)


class Fp8Calls(unittest.TestCase):
    def setUp(self):
        self.library = _support.library_or_skip(self)
        if self.library.abi_version < 3:
            self.fail(f"{self.library.path} has ABI version {self.library.abi_version}: no FP8 calls")
        self.buffer = array.array("f", [0.0] * 64)

    def refused(self, call, *args, **kwargs) -> FaError:
        with self.assertRaises(FaError) as caught:
            call(*args, **kwargs)
        self.assertIn("fa_fp8_", caught.exception.message)
        return caught.exception

    def forward(self, **changes):
        b = self.buffer
        arguments = dict(problem=PROBLEM, out_dtype="bf16", v_layout=capi.FA_FP8_V_ROWS, qk_dim=0, q=b, k=b, v=b,
                         q_descale=b, k_descale=b, v_descale=b, o=b, lse=None, workspace=b)
        arguments.update(changes)
        return self.refused(self.library.fp8_forward, **arguments)

    def test_workspace_sizes(self):
        # V's per-channel amax: 4 bytes per (batch, KV head, padded channel)
        self.assertEqual(self.library.fp8_workspace_bytes(PROBLEM, "quantize"), 1 * 2 * 128 * 4)
        forward = self.library.fp8_workspace_bytes(PROBLEM, "forward")
        # at least Q and K padded to 128 and V transposed (keys rounded up to 16)
        self.assertGreaterEqual(forward, (4 * 100 + 2 * 130) * 128 + 2 * 128 * 144)
        self.assertEqual(self.library.fp8_workspace_bytes(PROBLEM, "attention"), forward)
        self.assertEqual(forward % 256, 0)

    def test_a_head_dim_past_256_is_an_invalid_shape(self):
        error = self.refused(self.library.fp8_workspace_bytes, Problem(1, 2, 2, 8, 8, 300), "forward")
        self.assertEqual(error.status, capi.FA_INVALID_SHAPE)
        self.assertIn("256", error.message)

    def test_an_unknown_workspace_call_is_refused(self):
        status = self.library.handle.fa_fp8_workspace_bytes(ctypes.byref(capi.FaProblem.of(PROBLEM)), 7)
        self.assertEqual(status, -1)
        self.assertIn("FA_FP8_QUANTIZE", self.library.last_error())

    def test_a_struct_too_small_or_null(self):
        self.assertEqual(self.library.handle.fa_fp8_forward(None), capi.FA_INVALID_ARGUMENT)
        self.assertIn("args is NULL", self.library.last_error())
        args = capi.FaFp8ForwardArgs()
        args.size = 72  # a version-2 size: the FP8 struct came with version 3
        self.assertEqual(self.library.handle.fa_fp8_forward(ctypes.byref(args)), capi.FA_INVALID_ARGUMENT)
        self.assertIn("ABI version 3", self.library.last_error())

    def test_dtype_layout_and_row_width_are_checked_first(self):
        self.assertEqual(self.forward(out_dtype="fp16", v_layout=5).status, capi.FA_INVALID_ARGUMENT)
        error = self.forward(qk_dim=99)
        self.assertEqual(error.status, capi.FA_INVALID_SHAPE)
        self.assertIn("dim (80) or Dpad (128)", error.message)
        bad_dtype = capi.FaForwardArgs(ctypes.sizeof(capi.FaForwardArgs), ctypes.pointer(capi.FaProblem.of(PROBLEM)))
        self.assertEqual(self.library.handle.fa_fp8_attention(ctypes.byref(bad_dtype), 3, 1),
                         capi.FA_INVALID_ARGUMENT)
        self.assertIn("FA_DTYPE_FP16", self.library.last_error())

    def test_null_tensors_are_named(self):
        error = self.forward(workspace=None)
        self.assertEqual(error.status, capi.FA_INVALID_ARGUMENT)
        self.assertIn("workspace is NULL", error.message)
        b = self.buffer
        error = self.refused(self.library.fp8_quantize, PROBLEM, "fp16", True, b, b, b, b, b, b, b, b, None, b)
        self.assertIn("v_descale is NULL", error.message)

    def test_without_an_h100_each_call_is_refused_once_and_clearly(self):
        """No GPU: FA_CUDA_ERROR saying so; a GPU other than sm_90: FA_UNSUPPORTED naming sm_90; on an
        H100 or H200 the host buffers are refused as host memory. Never a crash."""
        b = self.buffer
        errors = [self.forward(),
                  self.refused(self.library.fp8_attention, PROBLEM, "fp16", True, b, b, b, b, workspace=b),
                  self.refused(self.library.fp8_quantize, PROBLEM, "bf16", False, b, b, b, b, b, b, b, b, b, b)]
        for error in errors:
            with self.subTest(call=error.call):
                if error.status == capi.FA_CUDA_ERROR:
                    self.assertRegex(error.message, r"(?i)gpu|driver|device")
                elif error.status == capi.FA_UNSUPPORTED:
                    self.assertIn("sm_90", error.message)
                else:
                    self.assertEqual(error.status, capi.FA_INVALID_ARGUMENT)
                    self.assertIn("host memory", error.message)


if __name__ == "__main__":
    unittest.main()
