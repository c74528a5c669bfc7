// The translation unit that carries the precompiled <torch/torch.h> (cmake/torch_pch.cmake).
