"""Rollouts with vLLM: every role adapter served as a vLLM LoRA, each request routed to its role's adapter.

Three backends share the contract of ``TransformersBackend`` (``generate``) plus ``sync_adapters``, which the trainer
calls after each optimizer step:

    VLLMBackend        a vLLM engine (``vllm.LLM``) inside the training process, one batch per tick (colocated);
    AsyncVLLMBackend   vLLM's ``AsyncLLM`` (engine core in a child process): also ``agenerate``, one request per
                       call, batched continuously by vLLM's scheduler (the engine's ``rollout_mode="async"``);
    VLLMServerBackend  one or several ``vllm serve --enable-lora`` servers, adapters loaded at runtime over HTTP
                       (``vllm_server.py``).

Why it is built this way (vLLM 0.32, measured on CPU):
- Adapters travel as PEFT folders, the only way vLLM takes LoRA weights; they are written under ``/dev/shm`` (RAM).
- Every update goes to a new folder. vLLM keys its prefix cache by adapter name and path, so a new path keeps KV
  blocks computed with the old weights from being reused; the same id with a new path but without ``load_inplace``
  silently keeps serving the old weights.
- An update is loaded once, eagerly (``add_lora(load_inplace=True)``); requests then carry the adapter without
  ``load_inplace``, which would reload it from disk at every engine step.
- Every request carries an adapter, base-model ones too (``"__base__"`` is served by an all-zero adapter): on CPU a
  request without adapter gets the adapter of the last slot once all ``max_loras`` slots are full. ``max_loras`` is
  the number of role adapters + 1, so every adapter and the zero one fit in one batch.
- The sampled token's log-prob comes back with each token (``logprobs=0``), after temperature scaling
  (``logprobs_mode="processed_logprobs"``), in the serving dtype: what TRL's importance-sampling correction compares
  with the trainer's recomputed log-probs.
- A request's ``generation_kwargs`` (its role's sampling settings) override ``sampling`` for that request: one
  ``SamplingParams`` per request. Stop strings need detokenization, and are kept in the output
  (``include_stop_str_in_output``) so the completion's tokens and text agree, as with the transformers backend.
- Each result's ``provenance`` says which adapter's weights, of which version, sat in the LoRA slot the request was
  sent to (``AdapterFolders.slots``, written when vLLM loaded them): a role whose sync was missed or whose slot holds
  another role's adapter shows there, not only as a gap between vLLM's and the trainer's log-probs.
- ``AsyncLLM`` binds to the event loop it first runs on, and the rollout engine runs each step in a new one: it
  lives on a loop of its own (``event_loop.BackgroundLoop``); a cancelled call aborts its vLLM request.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ...adapters.routing import BASE_MODEL
from ..chat_rendering import ChatRenderer
from .base import GenerationRequest, GenerationResult, Provenance, RendersPrompts
from .event_loop import BackgroundLoop, LoopCalls
from .transformers_backend import settings_key

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM accepts for max_lora_rank


class AdapterFolders:
    """One PEFT folder per adapter version under a temporary directory (in RAM when ``/dev/shm`` exists).

    Ids are fixed per name (vLLM's LoRA id); every save writes a new folder, and ``release_old`` deletes the
    folders of older versions once vLLM has loaded the new one. ``weights_step()``, if given, is the optimizer step
    of the weights being saved (the trainer's ``global_step``); ``loaded`` records it per slot once vLLM holds them.
    """

    def __init__(
        self, adapter_names: Sequence[str], root: str | None = None, weights_step: Callable[[], int] | None = None
    ):
        if BASE_MODEL in adapter_names:
            raise ValueError(f"{BASE_MODEL!r} is reserved for the base model and cannot name an adapter.")
        if root is None and os.path.isdir("/dev/shm"):
            root = "/dev/shm"
        self._tmp = tempfile.TemporaryDirectory(prefix="trl_multiagent_vllm_", dir=root)
        self.adapter_names = list(adapter_names)
        self.ids = {name: i + 1 for i, name in enumerate([*adapter_names, BASE_MODEL])}
        self.paths: dict[str, str] = {}  # name -> folder of the version being served
        self._old: dict[str, list[str]] = {}
        self._versions = itertools.count()
        self.weights_step = weights_step
        self.slots: dict[int, tuple[str, int | None]] = {}  # LoRA id -> (adapter, version) vLLM was last given there
        self._saved: dict[str, int | None] = {}  # name -> version of the weights in its newest folder

    def save(self, peft_model, name: str) -> str:
        """Write the current weights of adapter ``name`` (``BASE_MODEL``: an all-zero adapter) to a new folder."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        source = next(iter(peft_model.peft_config)) if name == BASE_MODEL else name
        state = get_peft_model_state_dict(peft_model, adapter_name=source)
        if name == BASE_MODEL:
            state = {key: value.new_zeros(value.shape) for key, value in state.items()}
        path = os.path.join(self._tmp.name, f"{name}-{next(self._versions)}")
        os.makedirs(path)
        state = {key: value.detach().cpu().contiguous() for key, value in state.items()}
        save_file(state, os.path.join(path, "adapter_model.safetensors"))
        peft_model.peft_config[source].save_pretrained(path)
        if name in self.paths:
            self._old.setdefault(name, []).append(self.paths[name])
        self.paths[name] = path
        trained = name != BASE_MODEL and self.weights_step is not None  # the zero adapter stands for the base model
        self._saved[name] = self.weights_step() if trained else None
        return path

    def loaded(self, name: str) -> None:
        """vLLM now holds the newest folder of ``name`` in its slot: requests to that slot are served by it."""
        self.slots[self.ids[name]] = (name, self._saved.get(name))

    def provenance(self, name: str, backend: str) -> Provenance:
        """What a request routed to ``name`` is served by: what was last loaded into ``name``'s slot."""
        held = self.slots.get(self.ids[name])
        if held is None:
            raise RuntimeError(f"vLLM's LoRA slot {self.ids[name]} for adapter {name!r} was never loaded.")
        return Provenance(*held, backend)

    def release_old(self, name: str) -> None:
        for path in self._old.pop(name, []):
            shutil.rmtree(path, ignore_errors=True)

    def to_sync(self, adapter_names: Sequence[str] | None) -> list[str]:
        """The adapters a sync writes: the given ones (default: all), plus the zero adapter the first time."""
        names = list(adapter_names if adapter_names is not None else self.adapter_names)
        return names if BASE_MODEL in self.paths else [*names, BASE_MODEL]

    def check_synced(self, adapters: Sequence[str]) -> None:
        missing = sorted(set(adapters) - set(self.paths))
        if missing:
            unknown = sorted(set(missing) - set(self.ids))
            if unknown:
                raise KeyError(f"Adapter(s) {unknown} are not served by vLLM; it serves {sorted(self.ids)}.")
            raise RuntimeError(f"Adapter(s) {missing} were never sent to vLLM: call `sync_adapters(model)` first.")


def max_lora_rank(rank: int) -> int:
    """The smallest rank slot vLLM accepts that holds adapters of LoRA rank ``rank``."""
    fitting = [slot for slot in _LORA_RANKS if slot >= rank]
    if not fitting:
        raise ValueError(f"vLLM serves LoRA ranks up to {_LORA_RANKS[-1]}, got r={rank}.")
    return fitting[0]


def request_sampling(sampling: dict[str, Any], generation_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The sampling arguments of one request: the backend's, overridden by the request's own settings."""
    merged = {**sampling, **generation_kwargs}
    if merged.get("stop"):
        merged.update(detokenize=True, include_stop_str_in_output=True)  # vLLM matches stop strings on text
    return merged


def request_result(
    renderer: ChatRenderer, prompt_ids, token_ids, *, logprobs, eos_token_ids, stopped: bool = False
) -> GenerationResult:
    """``stopped``: vLLM finished the request on a stop condition (an EOS id or a stop string), not on length.
    ``renderer`` turns the completion into the text the workflow is handed."""
    # A log-prob the server could not serialise (-inf) arrives as None: NaN, which TRL's correction treats as 1.
    completion = list(token_ids)
    logprobs = [float("nan") if lp is None else float(lp) for lp in logprobs]
    end = next((i + 1 for i, token in enumerate(completion) if token in eos_token_ids), None)
    if end is not None:
        completion, logprobs = completion[:end], logprobs[:end]
    return GenerationResult(
        prompt_ids=list(prompt_ids),
        completion_ids=completion,
        text=renderer.completion_text(completion),
        truncated=end is None and not stopped,
        sampling_logprobs=logprobs,
    )


class VLLMBackend(RendersPrompts):
    """A vLLM engine in this process; each request generates through the LoRA of its adapter.

    Args:
        model: base model name or folder, loaded by vLLM (the same weights the trainer's LoRAs sit on).
        tokenizer: renders the prompts (with ``chat_rendering`` and ``chat_template_kwargs``), exactly as
            ``TransformersBackend`` does.
        adapter_names: the role adapters to serve.
        lora_rank: LoRA rank ``r`` of the adapters.
        sampling: ``vllm.SamplingParams`` arguments (``max_tokens``, ``temperature``, ``top_p``, ...).
        eos_token_ids: a completion ends with the first of these (kept in ``completion_ids``).
        adapter_dir: where adapter folders are written (default: a temporary folder under ``/dev/shm``).
        weights_step: the optimizer step of the trained weights now (the trainer's ``global_step``), read at each
            sync: each result's ``provenance`` carries the version its adapter's slot was last loaded with.
        engine_kwargs: passed to ``vllm.LLM`` (``dtype``, ``gpu_memory_utilization``, ``max_model_len``, ...).
    """

    def __init__(
        self,
        model: str,
        tokenizer,
        adapter_names: Sequence[str],
        lora_rank: int,
        sampling: dict[str, Any],
        eos_token_ids: Sequence[int],
        chat_template_kwargs: dict[str, Any] | None = None,
        adapter_dir: str | None = None,
        chat_rendering: str = "tokenizer",
        weights_step: Callable[[], int] | None = None,
        **engine_kwargs,
    ):
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.renderer = ChatRenderer(tokenizer, chat_rendering, chat_template_kwargs)
        self.folders = AdapterFolders(adapter_names, adapter_dir, weights_step)
        self.sampling = {**sampling, "detokenize": False}
        self._params_of: dict[tuple, Any] = {}  # one SamplingParams per distinct settings, made once
        self._start_engine(
            model=model,
            enable_lora=True,
            max_loras=len(self.folders.ids),
            max_lora_rank=max_lora_rank(lora_rank),
            logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )
        self._sampling_params({})  # bad sampling arguments fail here, not at the first rollout

    def _start_engine(self, **engine_args) -> None:
        # The engine core must run in this process: adapters are loaded into it synchronously after each step.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.llm = LLM(**{"distributed_executor_backend": "uni", **engine_args})

    def _sampling_params(self, generation_kwargs: dict[str, Any]):
        from vllm import SamplingParams

        key = settings_key(generation_kwargs)
        if key not in self._params_of:
            sampling = request_sampling(self.sampling, generation_kwargs)
            self._params_of[key] = SamplingParams(
                **sampling, n=1, logprobs=0, stop_token_ids=sorted(self.eos_token_ids)
            )
        return self._params_of[key]

    def sync_adapters(self, peft_model, adapter_names: Sequence[str] | None = None) -> None:
        """Serve the current weights of ``adapter_names`` (default: every adapter) from the next ``generate`` on."""
        from vllm.lora.request import LoRARequest

        for name in self.folders.to_sync(adapter_names):
            path = self.folders.save(peft_model, name)
            self.llm.llm_engine.add_lora(LoRARequest(name, self.folders.ids[name], path, load_inplace=True))
            self.folders.loaded(name)
            self.folders.release_old(name)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        self.folders.check_synced([r.adapter for r in requests])
        prompts = self.prompt_ids_of(requests)
        ids, paths = self.folders.ids, self.folders.paths
        loras = [LoRARequest(r.adapter, ids[r.adapter], paths[r.adapter]) for r in requests]
        prompts_in = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        per_request = [self._sampling_params(r.generation_kwargs) for r in requests]
        stamps = [self.folders.provenance(r.adapter, "vllm-colocate") for r in requests]
        outputs = self.llm.generate(prompts_in, per_request, lora_request=loras, use_tqdm=False)
        results = [self._result(prompt, output.outputs[0]) for prompt, output in zip(prompts, outputs)]
        for result, stamp in zip(results, stamps):
            result.provenance = stamp
        return results

    def _result(self, prompt: list[int], sample) -> GenerationResult:
        """A ``GenerationResult`` from vLLM's ``CompletionOutput`` (the sampled token's log-prob at each step)."""
        logprobs = [step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)]
        stopped = sample.finish_reason == "stop"
        return request_result(
            self.renderer,
            prompt,
            sample.token_ids,
            logprobs=logprobs,
            eos_token_ids=self.eos_token_ids,
            stopped=stopped,
        )


class AsyncVLLMBackend(LoopCalls, VLLMBackend):
    """vLLM's ``AsyncLLM`` in a child process of this one: ``agenerate`` submits one call the moment its episode makes
    it, and vLLM's scheduler batches whatever is running (continuous batching). Same arguments as ``VLLMBackend``
    (``engine_kwargs`` go to ``vllm.AsyncEngineArgs``); ``generate`` still answers a whole batch (evaluation, ticks).
    """

    def _start_engine(self, **engine_args) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._loop = BackgroundLoop("vllm-async-engine")
        args = AsyncEngineArgs(**{"disable_log_stats": True, **engine_args})

        async def start():  # on the backend's loop, where AsyncLLM starts its output handler
            return AsyncLLM.from_engine_args(args)

        self.engine = self._loop.run(start())

    def sync_adapters(self, peft_model, adapter_names: Sequence[str] | None = None) -> None:
        from vllm.lora.request import LoRARequest

        for name in self.folders.to_sync(adapter_names):
            path = self.folders.save(peft_model, name)
            request = LoRARequest(name, self.folders.ids[name], path, load_inplace=True)
            self._loop.run(self.engine.add_lora(request))
            self.folders.loaded(name)
            self.folders.release_old(name)

    async def _complete(self, request: GenerationRequest, prompt: list[int]) -> GenerationResult:
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        params = self._sampling_params(request.generation_kwargs)
        name = request.adapter
        lora = LoRARequest(name, self.folders.ids[name], self.folders.paths[name])
        stamp = self.folders.provenance(name, "vllm-async")
        final = None
        stream = self.engine.generate(
            TokensPrompt(prompt_token_ids=prompt), params, uuid.uuid4().hex, lora_request=lora
        )
        async for output in stream:  # one output, at the end (the default output_kind is FINAL_ONLY)
            final = output
        result = self._result(prompt, final.outputs[0])
        result.provenance = stamp
        return result

    def unfinished_requests(self) -> int:
        """Requests vLLM still holds (0 once a rollout has ended, also after a failed one)."""
        return self.engine.get_num_unfinished_requests()

    def close(self) -> None:
        async def stop() -> None:  # the output handler first, so that it does not report the engine's exit
            if self.engine.output_handler is not None:
                self.engine.output_handler.cancel()
            self.engine.shutdown()

        self._loop.run(stop())
        self._loop.close()
