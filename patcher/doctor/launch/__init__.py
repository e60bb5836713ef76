"""The launch the user will run, read without running anything of SGLang's.

`arguments.read_arguments` reads a release's launch options from its own source;
`parse.parse_launch` parses a launch command with them; `quantization.checkpoint_quantization`
names a checkpoint's quantization as SGLang does; `gpu.present_gpus` asks `nvidia-smi` which
compute capabilities are present. Self-contained: nothing here imports the rest of doctor but
`doctor/kernels/bounded.py`.
"""
