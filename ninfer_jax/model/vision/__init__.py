"""The vision side of the multimodal families (Qwen3-VL, Qwen3.5): config.py (hyper-parameters
and params tree), grid.py (host metadata of one encode from the items' patch grids), tower.py
(the jitted tower) and mrope.py (three-axis text positions for prompts with media spans)."""
