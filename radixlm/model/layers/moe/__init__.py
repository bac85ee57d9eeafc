"""Mixture-of-experts layers: the experts' weights (experts.py), the fused expert computation
(fused_moe.py: a torch path here, native CPU ops registered beside it) and routing (top-k)."""
