"""Running the model (SGLang's model_executor): runner.py's ModelRunner (built from
runner_config.py) turns the scheduler's ModelWorkerBatch (worker_batch.py; M-RoPE positions:
mrope.py) into a ForwardBatch and runs it; decode steps replay CUDA graphs (cuda_graph_runner.py) or
torch.compile's graphs on a CPU (compiled_decode.py), both over static_decode.py's buffers;
pp_micro.py splits a step into micro-batches through the pipeline; weight_update.py swaps, reads and
releases the served weights. ForwardBatch itself (model/forward_batch.py) stays below: layers and
models read it."""
