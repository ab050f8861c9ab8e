"""fa_course.fp8, FP8 (e4m3) attention through stage 14 (forward only, H100/H200): the checks that
need PyTorch but no GPU (wrong dtype, device, shape, descale, requires_grad), and on an sm_90 GPU the
three calls against a float64 reference with stage 14's tolerance (stages/14_fp8/fp8_tolerance.hpp:
every element within 2u max|V|, the L2 error within 2u of P·|V|'s, the LSE within u; u = 2^-4), and
e4m3 inputs of the caller's own, with FlashAttention-3's descales, against the reference on the
values they hold.

Run by tests/torch/run.py fp8 (ctest: "python: fa_course.fp8 ..."); TestFp8Gpu skips, saying why,
without an H100 or H200."""

import math

import pytest

import availability  # also puts the fa_course package on sys.path

torch = pytest.importorskip("torch")

import fa_course  # noqa: E402
from fa_course import fp8  # noqa: E402

E4M3_UNIT = 2.0**-4  # fp8_tolerance.hpp, kE4m3Unit


def gpu_skip_reason() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"{torch.cuda.get_device_name()} is not an H100 or H200 (sm_90): stage 14 runs there alone"
    return availability.unavailable_reason("fp8")


class TestFp8Checks:
    """Refused before anything runs: no GPU needed."""

    def test_float32_on_the_cpu_is_refused(self):
        q = torch.zeros(1, 2, 8, 64)
        with pytest.raises(TypeError, match=r"fa_course\.fp8\.attention takes torch\.float16 on CUDA"):
            fp8.attention(q, q, q)

    def test_e5m2_is_not_e4m3(self):
        q = torch.zeros(1, 2, 8, 64).to(torch.float8_e5m2)
        with pytest.raises(TypeError, match=r"attention_quantized takes torch\.float8_e4m3fn on CUDA"):
            fp8.attention_quantized(q, q, q, None, None, None)

    def test_shapes_and_layout(self):
        q = torch.zeros(1, 3, 8, 64, dtype=torch.float16)
        k = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
        with pytest.raises((TypeError, ValueError)):  # CPU tensors: the dtype check speaks first
            fp8.quantize(q, k, k)
        with pytest.raises(ValueError, match="4-D"):
            fp8.attention(q[0], k, k)

    def test_requires_grad_says_forward_only(self):
        q = torch.zeros(1, 2, 8, 64, requires_grad=True)
        for call in (fp8.attention, fp8.quantize):
            with pytest.raises(RuntimeError, match="forward only"):
                call(q, q, q)
        with torch.no_grad():  # no graph to build: the other checks speak
            with pytest.raises(TypeError):
                fp8.attention(q, q, q)

    def test_the_package_offers_the_three_calls(self):
        assert "fp8" in fa_course.__all__
        assert {"quantize", "attention_quantized", "attention"} <= set(fp8.__all__)


def reference(q, k, v, causal):
    """O and LSE in float64 (the inputs as given), query head h reading KV head h // G."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
        scores = scores.masked_fill(~mask, -math.inf)
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def assert_fp8_close(out, lse, q, k, v, causal):
    expected, expected_lse = reference(q, k, v, causal)
    error = (out.double() - expected).abs()
    bound = 2 * E4M3_UNIT * v.double().abs().max().item()
    assert torch.isfinite(out).all()
    assert error.max().item() <= bound, f"max |O - O_ref| {error.max().item():.4g} > {bound:.4g}"
    magnitude, _ = reference(q, k, v.abs(), causal)  # P·|V|: the scale of O's error (fp8_tolerance.hpp)
    relative = (error.norm() / magnitude.norm()).item()
    assert relative <= 2 * E4M3_UNIT, f"L2 error relative to P·|V| {relative:.4g} > {2 * E4M3_UNIT}"
    if lse is not None:
        assert (lse.double() - expected_lse).abs().max().item() <= E4M3_UNIT


# square; causal, grouped, Nq != Nk, D = 80 (padded to 128); D = 256
SHAPES = [((2, 4, 4, 256, 256, 64), False), ((1, 8, 2, 200, 333, 80), True), ((1, 2, 1, 130, 130, 256), True)]


@pytest.mark.skipif(bool(gpu_skip_reason()), reason=gpu_skip_reason() or "runs")
class TestFp8Gpu:
    @pytest.mark.parametrize("shape,causal", SHAPES)
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_attention_against_the_reference(self, shape, causal, dtype):
        b, hq, hkv, nq, nk, d = shape
        generator = torch.Generator(device="cuda").manual_seed(14)
        q = torch.randn(b, hq, nq, d, device="cuda", generator=generator).to(dtype)
        k = torch.randn(b, hkv, nk, d, device="cuda", generator=generator).to(dtype)
        v = torch.randn(b, hkv, nk, d, device="cuda", generator=generator).to(dtype)
        out, lse = fp8.attention(q, k, v, causal=causal, return_lse=True)
        assert out.dtype == dtype and out.shape == q.shape and lse.shape == q.shape[:3]
        assert_fp8_close(out, lse, q, k, v, causal)
        # quantize + attention_quantized is the same work in two calls: the same bits
        quantized = fp8.quantize(q, k, v)
        assert quantized.q.dtype == torch.float8_e4m3fn and quantized.v_descale.dtype == torch.float32
        assert torch.equal(fp8.attention_quantized(quantized, causal=causal), out)

    @pytest.mark.parametrize("shape,causal", SHAPES)
    def test_e4m3_of_our_own_with_fa3_descales(self, shape, causal):
        """The caller quantizes, one scale per (batch, KV head) as FlashAttention-3 does; the reference
        runs on the values the e4m3 tensors hold, so only the kernel's own rounding (P) remains."""
        b, hq, hkv, nq, nk, d = shape
        generator = torch.Generator(device="cuda").manual_seed(3)
        q = torch.randn(b, hq, nq, d, device="cuda", generator=generator)
        k = torch.randn(b, hkv, nk, d, device="cuda", generator=generator)
        v = torch.randn(b, hkv, nk, d, device="cuda", generator=generator)

        def per_kv_head(x, heads_per_kv):
            amax = x.abs().amax(dim=(2, 3)).view(b, hkv, heads_per_kv).amax(dim=2)
            descale = (amax / 448).float()
            scale = descale.repeat_interleave(heads_per_kv, dim=1)[:, :, None, None]
            return (x / scale).to(torch.float8_e4m3fn), descale, scale

        q8, q_descale, q_scale = per_kv_head(q, hq // hkv)
        k8, k_descale, k_scale = per_kv_head(k, 1)
        v8, v_descale, v_scale = per_kv_head(v, 1)
        out = fp8.attention_quantized(q8, k8, v8, q_descale, k_descale, v_descale, causal=causal,
                                      out_dtype=torch.float16)
        assert out.dtype == torch.float16
        assert_fp8_close(out, None, q8.float() * q_scale, k8.float() * k_scale, v8.float() * v_scale, causal)

    def test_a_wrong_descale_shape_is_refused(self):
        q8 = torch.zeros(1, 2, 8, 64, device="cuda").to(torch.float8_e4m3fn)
        good = torch.ones(1, 2, device="cuda")
        with pytest.raises(ValueError, match=r"k_descale must have shape \(1, 2, 1\)"):
            fp8.attention_quantized(q8, q8, q8, good, torch.ones(1, 3, device="cuda"), good)
        with pytest.raises(TypeError, match="torch.float32"):
            fp8.attention_quantized(q8, q8, q8, good, good, good.double())
