"""Serve a trained policy over HTTP: a Ray Serve deployment around an in-process vLLM engine.

API (OpenAI-style subset), bound to 127.0.0.1 by default:

    POST /v1/completions  {"prompt": str, "max_tokens": int = 32, "temperature": float = 1.0, "n": int = 1}
         -> {"object": "text_completion", "model": ..., "choices": [{"index", "text", "finish_reason"}], "usage": {...}}
    GET  /v1/models, GET /health

Bad requests get a 4xx with a message and the server stays up: invalid JSON, a missing/empty prompt, wrong types or
a non-finite temperature (422), ``max_tokens`` above the server's limit or past the model's context, ``n`` above the
limit, ``n > 1`` with greedy decoding (400).

Concurrency: ``vllm.LLM`` is not thread-safe, so requests never call it directly. Ray Serve's ``@serve.batch`` gathers
concurrent requests into one list (up to ``max_batch_size``), and one batch at a time runs ``LLM.generate`` on a single
dedicated thread — the thread that created the engine — so the event loop keeps answering (``/health``, 4xx) while a
batch generates, and vLLM batches the requests' sequences together. (``ray.serve.llm`` asks Ray for a GPU by default
and does not come up on CPU-only machines, hence this deployment.)
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Union

from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from ray import serve

from envs.llm_runtime import configure_vllm_env, context_length, generate_from_ids, get_engine, sampling_params

SERVE_SHUTDOWN_TIMEOUT_S = 60

app = FastAPI(title="rllib-tba policy server")


@app.exception_handler(RequestValidationError)
async def _invalid_request(request, exc: RequestValidationError):
    """422 with what is wrong in each field, without echoing the input (a NaN in it would make the reply itself
    invalid JSON, turning a client error into a 500)."""
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": detail})


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr = Field(min_length=1)
    max_tokens: StrictInt = Field(32, ge=1)
    temperature: Union[StrictInt, StrictFloat] = Field(1.0, ge=0.0, le=10.0, allow_inf_nan=False)
    n: StrictInt = Field(1, ge=1)
    model: Optional[StrictStr] = None  # accepted for OpenAI-client compatibility; this server has one model


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=256)
@serve.ingress(app)
class PolicyServer:
    def __init__(self, model_dir: str, max_tokens_limit: int = 512, max_n: int = 16, dtype: str = "auto",
                 max_model_len: int | None = None, max_batch_size: int = 64):
        configure_vllm_env()
        self.model_dir, self.max_tokens_limit, self.max_n = model_dir, max_tokens_limit, max_n
        self.max_model_len = max_model_len or context_length(model_dir)
        # the engine's own thread: it creates the engine and runs every generate call, one batch at a time
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self.engine = self._engine_thread.submit(get_engine, model_dir, dtype=dtype,
                                                 max_model_len=self.max_model_len).result()
        self.tokenizer = self.engine.get_tokenizer()
        self._generate_batch.set_max_batch_size(max_batch_size)

    @app.get("/health")
    def health(self):
        return {"status": "ok"}

    @app.get("/v1/models")
    def models(self):
        return {"object": "list", "data": [{"id": self.model_dir, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(self, request: CompletionRequest):
        if request.max_tokens > self.max_tokens_limit:
            raise HTTPException(400, f"max_tokens={request.max_tokens} is over this server's limit {self.max_tokens_limit}")
        if request.n > self.max_n:
            raise HTTPException(400, f"n={request.n} is over this server's limit {self.max_n}")
        if request.n > 1 and request.temperature == 0:
            raise HTTPException(400, f"n={request.n} needs temperature > 0: greedy decoding (temperature 0) gives one "
                                     "answer")
        prompt_ids = self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
        if len(prompt_ids) + request.max_tokens > self.max_model_len:
            raise HTTPException(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({request.max_tokens}) exceeds "
                                     f"the model context of {self.max_model_len} tokens")
        params = sampling_params(n=request.n, max_tokens=request.max_tokens, temperature=float(request.temperature))
        out = await self._generate_batch((prompt_ids, params))
        completion_tokens = sum(len(c.token_ids) for c in out.outputs)
        return {
            "id": f"cmpl-{out.request_id}", "object": "text_completion", "created": int(time.time()),
            "model": self.model_dir,
            "choices": [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason} for c in out.outputs],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt_ids) + completion_tokens},
        }

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005, max_concurrent_batches=1)
    async def _generate_batch(self, requests: list[tuple]) -> list:
        """One ``LLM.generate`` for a batch of ``(prompt ids, SamplingParams)`` on the engine's thread."""
        prompt_ids = [ids for ids, _ in requests]
        params = [p for _, p in requests]
        return await asyncio.get_running_loop().run_in_executor(
            self._engine_thread, lambda: generate_from_ids(self.engine, prompt_ids, params))


def build_app(checkpoint: str, model_dir: str | None = None, max_tokens_limit: int = 512, max_n: int = 16,
              dtype: str = "auto"):
    """A Serve application for an algorithm checkpoint (its policy is exported to ``model_dir``, default a temp dir)."""
    from rllib_tba.policy_export import export_hf_model

    model_dir = export_hf_model(checkpoint, model_dir or tempfile.mkdtemp(prefix="rllib-tba-serve-"))
    return PolicyServer.bind(model_dir, max_tokens_limit=max_tokens_limit, max_n=max_n, dtype=dtype)


def run_server(checkpoint: str, host: str = "127.0.0.1", port: int = 8000, **kwargs) -> None:
    """``rllib serve``: start Serve on host:port and block until Ctrl-C or SIGTERM, then shut Serve and Ray down."""
    import ray

    from rllib_tba.local_ray import init_local_ray, stop_on_signals, wait_for_stop

    try:
        init_local_ray()
        stopping = stop_on_signals()
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(str(Path(checkpoint).resolve()), **kwargs), name="rllib-tba", route_prefix="/")
        print(f"serving {checkpoint} at http://{host}:{port}/v1/completions (Ctrl-C to stop)", flush=True)
        wait_for_stop(stopping)
    except KeyboardInterrupt:
        print("shutting down", flush=True)
    finally:
        if ray.is_initialized():
            # bounded: Serve's graceful shutdown hung once for > 5 min after SIGINT; ray.shutdown() then stops the
            # replicas' worker processes anyway
            stopper = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
            stopper.start()
            stopper.join(SERVE_SHUTDOWN_TIMEOUT_S)
            if stopper.is_alive():
                print(f"Serve did not stop within {SERVE_SHUTDOWN_TIMEOUT_S} s; stopping Ray", flush=True)
            ray.shutdown()
