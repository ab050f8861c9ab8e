"""fa_course.bench.torch_gpu's pause after giving memory back, on a stand-in for torch (no GPU needed)."""

import types
import unittest
from unittest import mock

import _support  # noqa: F401  (the package on sys.path)
from fa_course.bench import torch_gpu

GIB = 2**30


def fake_torch(reserved_before: int, reserved_after: int):
    """A torch whose caching allocator holds reserved_before bytes until empty_cache, then reserved_after."""
    state = {"reserved": reserved_before, "emptied": 0}

    def empty_cache():
        state["reserved"] = reserved_after
        state["emptied"] += 1

    cuda = types.SimpleNamespace(memory_reserved=lambda: state["reserved"], empty_cache=empty_cache)
    return types.SimpleNamespace(cuda=cuda), state


class ReleaseCachedMemory(unittest.TestCase):
    def release(self, before: int, after: int):
        torch, state = fake_torch(before, after)
        with mock.patch.object(torch_gpu.time, "sleep") as sleep:
            released = torch_gpu.release_cached_memory(torch)
        self.assertEqual(state["emptied"], 1)
        return released, sleep

    def test_pauses_in_proportion_to_what_it_gave_back(self):
        released, sleep = self.release(8 * GIB + GIB // 2, GIB // 2)
        self.assertAlmostEqual(released, 8.0)
        sleep.assert_called_once()
        self.assertAlmostEqual(sleep.call_args.args[0], 8 * torch_gpu.RELEASE_SETTLE_S_PER_GIB)

    def test_nothing_given_back_means_no_pause(self):
        released, sleep = self.release(3 * GIB, 3 * GIB)
        self.assertEqual(released, 0.0)
        self.assertEqual(sleep.call_args.args[0], 0.0)


if __name__ == "__main__":
    unittest.main()
