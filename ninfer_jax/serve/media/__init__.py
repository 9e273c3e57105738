"""Media intake (--vision): sources, decoding, Qwen VL preprocessing, the payload cache."""
