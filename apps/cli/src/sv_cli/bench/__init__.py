"""`sv bench` (see `main`): the benchmarks of BENCHMARKS.md, one module per job.

- `main`: the command line and the order the workloads run in;
- `workloads`: load, memory, decode-b1, long context, step times, prefill, throughput, the
  quantized modes, the transformers peer;
- `spec`, `logprobs`, `grammar`, `tp`: the workloads of `--only spec | logprobs | grammar | tp`;
- `inputs`: the random checkpoint, the engine, random prompts, the scratch decode step;
- `runner`: a model runner's sizes (weight bytes a step reads, the KV pool) and its bare replay;
- `timing`: CUDA-event timing, graph replays back to back, the rooflines, the host probe;
- `profiles` and `critical_path`: `--profile`'s kernel tables and each kernel's share of a step;
- `report`: the rows and the final table.
"""
