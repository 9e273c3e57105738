"""The .ninfer v3 artifact format and its converters.

`load_artifact` / `save_artifact` / `Artifact` live in format.py; converters in gguf_convert.py,
hf_convert.py and random_init.py. Importing this package does not import jax.
"""
from ninfer_jax.artifact.format import Artifact, ArtifactContents, load_artifact, save_artifact

__all__ = ["Artifact", "ArtifactContents", "load_artifact", "save_artifact"]
