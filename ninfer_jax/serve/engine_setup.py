"""The engine the serve options ask for, built inside the engine-core process.

`core_spec(config)` is what the launcher hands to engine/core_process.start_core: the
environment the core starts with (`core_environment`: --device, --no-cuda-graph) and
`build_engine`, which the core calls to load the artifact with its weights, size the KV pool
(serve/kv_sizing.py), build the JaxRunner and the Engine (not started: the core adds its
listener, then starts it, and warm-up runs on the engine thread). Everything importing JAX
happens in these functions' bodies, so HTTP workers can import this module's callers freely.

`build_local_context` builds the same engine in-process, with a ServingContext around it,
for `ninfer replay --artifact` (one process, no HTTP workers).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from typing import Mapping

from ninfer_jax.engine.speculation import SpeculativeConfig
from ninfer_jax.engine.state_slots import extra_slots
from ninfer_jax.serve import kv_sizing
from ninfer_jax.serve.config import ServeConfig

log = logging.getLogger("ninfer_jax.serve")

PAGE_SIZE = 16
# XLA's switch for CUDA command buffers, the graphs it captures for decode steps; an empty
# value enables none of the command types.
NO_COMMAND_BUFFERS_FLAG = "--xla_gpu_enable_command_buffer="


def core_environment(config: ServeConfig, base: Mapping[str, str]) -> dict[str, str]:
    """Variables the engine core sets before importing JAX. --device N picks the Nth of the
    devices `base` already makes visible (all of them when CUDA_VISIBLE_DEVICES is unset),
    and with --tensor-parallel K the K devices from the Nth on (`auto`: every visible one,
    the variable left as it is); --no-cuda-graph appends the command-buffer switch to any
    XLA_FLAGS in `base`; --gpu-memory-utilization is XLA's allocator limit (without it 75%
    of the card, preallocating or not: 20 GB of an 80 GB H100 stayed unused, run 45's KV
    pool was 43 GiB with 16 GB of weights)."""
    visible = base.get("CUDA_VISIBLE_DEVICES")
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{config.gpu_memory_utilization:g}"}
    if config.tensor_parallel != "auto":
        count = int(config.tensor_parallel)
        devices = [str(config.device + i) for i in range(count)]
        if visible:
            choices = [d.strip() for d in visible.split(",") if d.strip()]
            if config.device + count > len(choices):
                wanted = (f"--device {config.device}" if count == 1 else
                          f"--device {config.device} --tensor-parallel {count}")
                raise ValueError(f"{wanted}: CUDA_VISIBLE_DEVICES={visible} makes only "
                                 f"{len(choices)} device(s) visible")
            devices = choices[config.device:config.device + count]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if config.no_cuda_graph:
        flags = base.get("XLA_FLAGS", "").strip()
        env["XLA_FLAGS"] = f"{flags} {NO_COMMAND_BUFFERS_FLAG}".strip()
    return env


def core_spec(config: ServeConfig, base_env: Mapping[str, str]):
    from ninfer_jax.engine.core_process import CoreSpec
    from ninfer_jax.serve.launcher import logging_config

    return CoreSpec(factory=build_engine, args=(config,),
                    env=core_environment(config, base_env),
                    logging=logging_config(config.log_level))


def build_engine(config: ServeConfig):
    """Load the artifact with its weights and build runner + Engine (not started)."""
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.engine.config import EngineConfig
    from ninfer_jax.engine.engine import Engine
    from ninfer_jax.engine.runner import JaxRunner, default_dtype, kv_dtype_for, step_tokens_of

    started = time.perf_counter()
    mesh = tensor_parallel_mesh(config)
    if mesh is None:
        # The device runtime starts (seconds on a GPU) while the first weights are read; the
        # text weights are read, fused and placed part by part, the stages overlapping
        # (engine/weight_pipeline.py), so they come back on the device.
        from ninfer_jax.engine import weight_pipeline

        runtime = threading.Thread(target=_start_runtime, name="ninfer-runtime", daemon=True)
        runtime.start()
        described = load_artifact(config.artifact, weights=False)
        check_weights(config, described.weight_formats, described.config)
        options = weight_pipeline.PipelineOptions(quantize=config.weights)
        artifact = load_artifact(config.artifact, weights=True, verify=config.verify_checksums,
                                 mtp=config.spec == "mtp", vision=config.vision,
                                 dflash=config.spec if config.spec in ("dflash", "dflash2") else None,
                                 draft_head=config.lm_head_draft,
                                 placement=weight_pipeline.placement(described.config,
                                                                     options=options))
        if config.weights:
            log.info("projections quantized to %s at load (--weights)", config.weights)
        runtime.join()
    else:  # each device reads only its shards of the weights (orbax, target shardings)
        if config.weights:  # --tensor-parallel auto resolved to several devices
            raise ValueError(f"--weights {config.weights} is not built for tensor parallelism")
        artifact = load_artifact(config.artifact, weights=True, verify=config.verify_checksums,
                                 shardings=functools.partial(
                                     _weight_shardings, mesh=mesh,
                                     expert_parallel=config.expert_parallel))
    read = time.perf_counter()
    max_context = effective_max_context(config, artifact)
    kv_dtype = kv_dtype_for(config.kv_dtype, block_weights=uses_block_weights(
        config, artifact.weight_formats))
    speculative = check_speculation(config, artifact.config, artifact.components)
    rows = runner_rows(config.max_concurrency, speculative)
    artifact, kv_tokens = kv_sizing.resolve_pool(
        config, artifact, default_dtype(), kv_dtype, max_context=max_context,
        page_size=PAGE_SIZE, step_tokens=step_tokens_of(config.prefill_chunk, rows["max_batch"]),
        mesh=mesh)
    engine_config = EngineConfig.from_serve_config(config, resolved_kv_tokens=kv_tokens)
    engine_config = dataclasses.replace(engine_config, max_context=max_context)
    log_state_slots(config, artifact.config)
    runner = JaxRunner(artifact, num_pages=engine_config.num_pages(PAGE_SIZE),
                       page_size=PAGE_SIZE, max_context=max_context,
                       prefill_chunk=config.prefill_chunk, kv_dtype=kv_dtype,
                       step_shapes=config.step_shapes,
                       tensor_parallel=1 if mesh is None else mesh.size,
                       vision=config.vision,
                       expert_parallel=config.expert_parallel,
                       penalty_lanes=config.max_concurrency,
                       chunk_segments=config.chunk_segments,
                       state_slot_capacity=runner_state_slots(
                           engine_config, artifact.config, speculative),
                       **rows, **drafter_config(artifact, speculative))
    engine = Engine(runner, engine_config, eos_ids=artifact.eos_ids)
    log.info("weights read and placed (and the device runtime started) in %.1f s, the rest "
             "placed and the runner built in %.1f s", read - started,
             time.perf_counter() - read)
    log.info("model %s (%s): context %d tokens, KV pool %d tokens of %s, %d lanes, %d state "
             "slots; warming up", artifact.name, artifact.config.architecture, max_context,
             engine.pool_tokens, runner.kv_dtype.name, config.max_concurrency,
             engine.slots.capacity)
    if config.http_workers > 1 and config.log_stats_interval_ms > 0:
        # One throughput report for the server, not one per HTTP worker (request_log.py).
        from ninfer_jax.serve.observability.throughput import ThroughputReporter

        ThroughputReporter(engine, config.log_stats_interval_ms / 1000.0).start()
    return engine


def tensor_parallel_mesh(config: ServeConfig):
    """The mesh --tensor-parallel asks for (None: one device), checked against the model
    before any weight is read: ValueError, one line, when the device count is more than
    the visible devices or does not divide the heads (or, with --expert-parallel, the
    routed experts)."""
    import jax

    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.model import tensor_parallel

    visible = len(jax.devices())
    size = visible if config.tensor_parallel == "auto" else int(config.tensor_parallel)
    if size > visible:
        raise ValueError(f"--tensor-parallel {size}: only {visible} device(s) visible")
    model_config = load_artifact(config.artifact, weights=False).config
    model_config.check_tensor_parallel(size, config.expert_parallel)
    if size == 1:
        return None
    mesh = tensor_parallel.make_mesh(size)
    log.info("tensor parallel%s over %d devices: %s",
             " (experts split by index)" if config.expert_parallel else "", size,
             ", ".join(str(device) for device in mesh.devices.flat))
    return mesh


def _weight_shardings(structure, *, mesh, expert_parallel: bool):
    from ninfer_jax.model import tensor_parallel

    return tensor_parallel.shardings(
        tensor_parallel.param_specs(structure, mesh.size, expert_parallel), mesh)


def uses_block_weights(config: ServeConfig, weight_formats: dict) -> bool:
    """Whether the projections are GGUF blocks: stored so, or quantized so at load."""
    from ninfer_jax.kernels.quant_matmul.formats import BLOCK_FORMATS

    return weight_formats.get("layers") in BLOCK_FORMATS or config.weights in BLOCK_FORMATS


def check_weights(config: ServeConfig, weight_formats: dict, model_config) -> None:
    """--weights for this artifact, or ValueError: its projections must still be float (a
    stored format is not re-quantized), on one device (tensor parallelism splits plain
    weights only), and a GGUF block format needs the dense projections' inputs in whole
    blocks of 32."""
    if config.weights is None:
        return
    from ninfer_jax.kernels.quant_matmul.formats import BLOCK_FORMATS, BLOCK_SIZE

    inputs = {"hidden_size": model_config.hidden_size,
              "intermediate_size": model_config.intermediate_size,
              "num_heads x head_dim": model_config.num_heads * model_config.head_dim}
    ragged = [f"{name} {value}" for name, value in inputs.items() if value % BLOCK_SIZE]
    if config.weights in BLOCK_FORMATS and ragged:
        raise ValueError(f"--weights {config.weights} needs the projections' inputs in "
                         f"blocks of {BLOCK_SIZE}: {', '.join(ragged)}")
    stored = weight_formats.get("layers")
    if stored not in ("f32", "bf16"):
        raise ValueError(f"--weights {config.weights}: the artifact's projections are "
                         f"already {stored}; serve it without --weights")
    if str(config.tensor_parallel).isdigit() and int(config.tensor_parallel) > 1:
        raise ValueError(f"--weights {config.weights} is not built for --tensor-parallel "
                         "(its shards are split from float weights); convert the artifact "
                         "with `ninfer convert --weights` instead")


def check_speculation(config: ServeConfig, model_config,
                      components: dict | None = None) -> SpeculativeConfig | None:
    """--spec for this model, or ValueError (an unimplemented backend, mtp without a head,
    dflash / dflash2 / --lm-head-draft without their component in `components`, a hybrid
    family under tensor parallelism, whose chained verify rows are not split, a hybrid with
    --vision, dflash / dflash2 with --tensor-parallel or --vision)."""
    speculative = SpeculativeConfig.from_options(config.spec, config.draft_tokens,
                                                 config.lm_head_draft)
    if speculative is not None:
        speculative.check_servable(model_config, components)
        # "auto" is resolved in the core; a mesh there makes the runner refuse instead
        if model_config.is_hybrid and str(config.tensor_parallel).isdigit() and \
                int(config.tensor_parallel) > 1:
            raise ValueError(f"--spec on a hybrid model ({model_config.architecture}) is not "
                             "built for --tensor-parallel; serve it on one device")
        if speculative.dflash_drafts and str(config.tensor_parallel).isdigit() and \
                int(config.tensor_parallel) > 1:  # its caches and store are not split
            raise ValueError(f"--spec {speculative.backend} is not built for "
                             "--tensor-parallel; serve it on one device")
        # chained verify rows and MTP drafts are not tested with MRoPE positions and media
        # rows (dense families speculate with media: their verify rows carry rope_delta)
        if model_config.is_hybrid and config.vision:
            raise ValueError(f"--spec on a hybrid model ({model_config.architecture}) is not "
                             "built for --vision; serve media without --spec")
        if speculative.dflash_drafts and config.vision:  # MRoPE positions: not tested
            raise ValueError(f"--spec {speculative.backend} is not built for --vision; "
                             "serve media with --spec ngram or without --spec")
    return speculative


def runner_rows(lanes: int, speculative: SpeculativeConfig | None) -> dict:
    """The runner's row capacity. With --spec every lane may verify K drafts: lanes x (K+1)
    rows (bounded) in decode steps. Steps with a prefill chunk keep one row per lane on CPU,
    where each chunk bucket is compiled at every row bucket (a larger capacity there would
    multiply start-up compiles; such steps carry drafts only within the lanes' bucket); GPUs
    compile chunk steps at a few row buckets anyway."""
    if speculative is None:
        return {"max_batch": lanes}
    from ninfer_jax.kernels.dispatch import use_kernels

    rows = speculative.row_capacity(lanes)
    log.info("speculative decoding: %s, %d draft tokens, up to %d rows per step",
             speculative.backend, speculative.draft_tokens, rows)
    return {"max_batch": rows, "max_chunk_rows": None if use_kernels() else lanes,
            "speculative": True, "mtp_drafts": speculative.mtp_drafts,
            "dflash_drafts": speculative.dflash_drafts}


def runner_state_slots(engine_config, model_config,
                       speculative: SpeculativeConfig | None) -> int:
    """The runner's usable state slots: a hybrid's lanes + spare ones; a dense model under a
    DFlash drafter one per lane (they hold its draft store only); else none."""
    if model_config.has_state:
        return engine_config.state_slot_capacity(True)
    if speculative is not None and speculative.dflash_drafts:
        return engine_config.max_concurrency
    return 0


def drafter_config(artifact, speculative: SpeculativeConfig | None) -> dict:
    """The runner's DFlash / DFlash2 config under --spec dflash / dflash2."""
    if speculative is None or not speculative.dflash_drafts:
        return {}
    return {"dflash_config": artifact.dflash_config(speculative.backend)}


def _start_runtime() -> None:
    import jax

    jax.devices()


def log_state_slots(config: ServeConfig, model_config) -> str | None:
    """Say what the state slots are for (hybrid models: lanes, then prefix checkpoints in
    the spare ones), or that --device-state-slots has no effect on a dense model."""
    spare = extra_slots(config.device_state_slots, config.max_concurrency)
    if model_config.has_state:
        message = (f"state slots: {config.max_concurrency} lanes + {spare}"
                   " spare (prefix reuse keeps state checkpoints in free slots)")
    elif config.device_state_slots:
        message = (f"--device-state-slots {config.device_state_slots} has no effect: "
                   f"{model_config.architecture} has no recurrent state")
    else:
        return None
    log.info("%s", message)
    return message


def effective_max_context(config: ServeConfig, artifact) -> int:
    max_context = min(config.max_context, artifact.config.max_position_embeddings)
    if max_context != config.max_context:
        log.warning("--max-context %d exceeds the model's %d positions; using %d",
                    config.max_context, max_context, max_context)
    return max_context


def build_local_context(config: ServeConfig):
    """An in-process engine (started) and the ServingContext around it (replay)."""
    from ninfer_jax.artifact.format import load_artifact
    from ninfer_jax.serve.launcher import serving_context

    engine = build_engine(config)
    engine.start()
    artifact = load_artifact(config.artifact, weights=False)
    return serving_context(config, artifact, engine)
