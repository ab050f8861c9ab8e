"""schema.py's formulas against brute-force counts."""

import itertools
import unittest

import _support  # noqa: F401  (puts the package on sys.path)
from fa_course.bench import schema


def brute_pairs(q_seq, kv_seq, causal):
    if not causal:
        return q_seq * kv_seq
    return sum(1 for i in range(q_seq) for j in range(kv_seq) if j <= i + kv_seq - q_seq)


class CausalKeyEnd(unittest.TestCase):
    def test_matches_the_mask_row_by_row(self):
        for q_seq, kv_seq in itertools.product(range(1, 12), range(1, 12)):
            for row in range(q_seq):
                visible = [j for j in range(kv_seq) if j <= row + kv_seq - q_seq]
                end = schema.causal_key_end(row, q_seq, kv_seq)
                self.assertEqual(list(range(end)), visible, (row, q_seq, kv_seq))

    def test_square_is_the_usual_lower_triangle(self):
        self.assertEqual([schema.causal_key_end(i, 5, 5) for i in range(5)], [1, 2, 3, 4, 5])

    def test_decode_rows_see_almost_every_key(self):
        self.assertEqual([schema.causal_key_end(i, 4, 100) for i in range(4)], [97, 98, 99, 100])

    def test_rows_before_the_keys_see_nothing(self):
        self.assertEqual([schema.causal_key_end(i, 6, 3) for i in range(6)], [0, 0, 0, 1, 2, 3])


class Pairs(unittest.TestCase):
    def test_non_causal(self):
        for q_seq, kv_seq in itertools.product(range(1, 20), range(1, 20)):
            self.assertEqual(schema.attention_pairs(q_seq, kv_seq, False), q_seq * kv_seq)

    def test_rectangular_causal_counts_the_unmasked_pairs_exactly(self):
        for q_seq, kv_seq in itertools.product(range(1, 40), range(1, 40)):
            if q_seq != kv_seq:
                self.assertEqual(schema.attention_pairs(q_seq, kv_seq, True), brute_pairs(q_seq, kv_seq, True),
                                 (q_seq, kv_seq))

    def test_square_causal_is_half_by_convention(self):
        # The published convention: N^2/2, slightly less than the N(N+1)/2 pairs actually computed.
        for seq in (1, 2, 7, 64, 4096):
            self.assertEqual(schema.attention_pairs(seq, seq, True), seq * seq / 2)
        for seq in (1, 2, 7, 64):
            self.assertEqual(brute_pairs(seq, seq, True) - seq * seq / 2, seq / 2)


class Flops(unittest.TestCase):
    def test_forward_is_two_matrix_products(self):
        self.assertEqual(schema.attention_flops(4, 16, 4096, 4096, 128, False), 4.0 * 4 * 16 * 4096 * 4096 * 128)

    def test_square_causal_halves(self):
        full = schema.attention_flops(2, 8, 1024, 1024, 64, False)
        self.assertEqual(schema.attention_flops(2, 8, 1024, 1024, 64, True), full / 2)

    def test_rectangular_causal_uses_the_exact_pairs(self):
        for q_seq, kv_seq in ((1, 17), (5, 9), (9, 5), (16, 4096)):
            expected = 4.0 * 3 * 6 * brute_pairs(q_seq, kv_seq, True) * 32
            self.assertEqual(schema.attention_flops(3, 6, q_seq, kv_seq, 32, True), expected)

    def test_kv_heads_do_not_change_the_flops(self):
        # GQA shares K and V, not the work: the signature takes only the query heads.
        self.assertEqual(schema.attention_flops(1, 32, 4, 4096, 128, False), 4.0 * 32 * 4 * 4096 * 128)

    def test_backward_multiples(self):
        forward = schema.attention_flops(1, 2, 64, 80, 16, False)
        self.assertEqual(schema.attention_flops(1, 2, 64, 80, 16, False, "bwd"), 2.5 * forward)
        self.assertEqual(schema.attention_flops(1, 2, 64, 80, 16, False, "fwd+bwd"), 3.5 * forward)


class MinimumBytes(unittest.TestCase):
    def elements(self, b, hq, hkv, nq, nk, d):
        q = b * hq * nq * d
        kv = b * hkv * nk * d
        return q, kv

    def test_forward_reads_q_k_v_and_writes_o(self):
        for shape in ((1, 1, 1, 1, 1, 1), (4, 16, 16, 4096, 4096, 128), (1, 32, 8, 4, 65536, 128), (2, 6, 3, 33, 257, 72)):
            q, kv = self.elements(*shape)
            for dtype, width in schema.ELEMENT_BYTES.items():
                self.assertEqual(schema.minimum_bytes(*shape, dtype), (2 * q + 2 * kv) * width, (shape, dtype))

    def test_forward_with_lse_adds_one_float_per_query_row(self):
        b, hq, hkv, nq, nk, d = 2, 8, 2, 100, 300, 64
        q, kv = self.elements(b, hq, hkv, nq, nk, d)
        self.assertEqual(schema.minimum_bytes(b, hq, hkv, nq, nk, d, "fp16", "fwd", with_lse=True),
                         (2 * q + 2 * kv) * 2 + b * hq * nq * 4)

    def test_backward(self):
        b, hq, hkv, nq, nk, d = 1, 4, 2, 10, 20, 8
        q, kv = self.elements(b, hq, hkv, nq, nk, d)
        lse = b * hq * nq * 4
        # reads Q, K, V, O, dO, LSE; writes dQ, dK, dV
        self.assertEqual(schema.minimum_bytes(b, hq, hkv, nq, nk, d, "bf16", "bwd"), (4 * q + 4 * kv) * 2 + lse)
        self.assertEqual(schema.minimum_bytes(b, hq, hkv, nq, nk, d, "bf16", "fwd+bwd"),
                         (2 * q + 2 * kv) * 2 + (4 * q + 4 * kv) * 2 + lse)

    def test_decode_is_essentially_k_and_v(self):
        total = schema.minimum_bytes(1, 32, 8, 1, 65536, 128, "fp16")
        kv_bytes = 2 * 8 * 65536 * 128 * 2
        self.assertGreater(kv_bytes / total, 0.99)


class BandwidthFloor(unittest.TestCase):
    def test_decode_moves_q_k_v_and_o_at_the_copy_bandwidth(self):
        b, hq, hkv, nq, nk, d = 16, 32, 8, 4, 65536, 128
        q_and_o = 2 * b * hq * nq * d * 2
        k_and_v = 2 * b * hkv * nk * d * 2
        self.assertAlmostEqual(schema.bandwidth_floor_ms(b, hq, hkv, nq, nk, d, "fp16", 4000.0),
                               (q_and_o + k_and_v) / 4000e9 * 1e3)

    def test_one_gigabyte_at_a_thousand_gigabytes_per_second_is_one_millisecond(self):
        # Q, K, V and O of 2.5e8 bytes each
        self.assertAlmostEqual(schema.bandwidth_floor_ms(1, 1, 1, 125, 125, 10**6, "fp16", 1000.0), 1.0)

    def test_it_is_minimum_bytes_of_the_pass(self):
        for pass_ in schema.PASSES:
            self.assertAlmostEqual(schema.bandwidth_floor_ms(2, 8, 2, 100, 300, 64, "bf16", 2000.0, pass_),
                                   schema.minimum_bytes(2, 8, 2, 100, 300, 64, "bf16", pass_) / 2e12 * 1e3)


class Columns(unittest.TestCase):
    def test_keys_are_columns(self):
        self.assertTrue(set(schema.RESULTS_KEY) <= set(schema.RESULTS_COLUMNS))
        self.assertTrue(set(schema.TRAFFIC_KEY) <= set(schema.TRAFFIC_COLUMNS))
        self.assertTrue(set(schema.CEILINGS_KEY) <= set(schema.CEILINGS_COLUMNS))

    def test_results_header_of_design_md(self):
        self.assertEqual(",".join(schema.RESULTS_COLUMNS),
                         "stage,gpu,B,Hq,Hkv,Nq,Nk,D,dtype,causal,pass,ms_median,ms_min,tflops,gbps,peak_bytes,"
                         "max_abs_err,rel_l2_err,status,source_hash,note")

    def test_no_duplicate_columns(self):
        for columns in (schema.RESULTS_COLUMNS, schema.LEGACY_RESULTS_COLUMNS, schema.TRAFFIC_COLUMNS,
                        schema.CEILINGS_COLUMNS):
            self.assertEqual(len(columns), len(set(columns)))



class Peers(unittest.TestCase):
    def test_cudnn_fp8_is_a_peer(self):
        # scripts/fp8_peers.py's row of cuDNN's FP8 attention: no source_hash, never one of our stages
        self.assertIn("cudnn_fp8", schema.PEERS)
        self.assertEqual(len(schema.PEERS), len(set(schema.PEERS)))

    def test_every_peer_has_a_colour(self):
        from fa_course.bench import figures

        self.assertEqual(set(figures.PEER_COLORS), set(schema.PEERS))


if __name__ == "__main__":
    unittest.main()
