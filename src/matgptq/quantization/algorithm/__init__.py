"""The algorithm, apart from the pipeline around it: pure functions of (W, H, settings). reference.py is GPTQ on one
screen, the place to start; solver.py and lazy_blocks.py compute the same fast (GPTQ and RTN on one matrix);
grid.py the integer grid and its scale search; multibit.py MatGPTQ's codes whose top bits serve every width;
refit.py each width's own scales; kquant_scales.py GGUF's k-quant scale lattice; hessian.py H from the inputs."""
