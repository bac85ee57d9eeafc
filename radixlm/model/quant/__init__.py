"""Quantization: the --quantization methods (methods.py: QUANTIZATION_REGISTRY) and pre-quantized
checkpoints (checkpoint.py: each config.json quant_method's parser, registered; the methods that
load them: awq_gptq.py, mxfp4_checkpoint.py, fp8_checkpoint.py)."""
