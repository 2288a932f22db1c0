"""Start-up: check where to listen, bind, load the pair, and serve until stopped.

The address is checked and bound before the models load, so a bad --host or a port in use is a
one-line error at once rather than after a minute of loading.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from types import FrameType

import uvicorn

from specchat.errors import SpecchatError
from specchat.models.catalog import load_catalog
from specchat.models.fetch import Progress
from specchat.server.app import create_app
from specchat.server.worker import Worker
from specchat.service.choices import ModelChoice
from specchat.service.local import open_local
from specchat.service.settings import API_KEY_ENV, resolve_api_key

GRACE_S = 3  # how long open requests get to end once the server is told to stop
STOP_WAIT_S = 30.0  # a prefill under way cannot be interrupted: how long to wait for it at exit


def serve(choice: ModelChoice, host: str, port: int, api_key: str | None, max_waiting: int,
          progress: Progress | None = None) -> None:
    api_key = resolve_api_key(api_key)
    if not 0 <= port <= 65535:
        raise SpecchatError(f"--port must be between 0 and 65535, got {port}")
    if max_waiting < 0:
        raise SpecchatError(f"--queue must be at least 0, got {max_waiting}")
    if api_key is None and not is_loopback(host):
        raise SpecchatError(f"--host {host} can be reached from other machines; give --api-key KEY (or set "
                            f"{API_KEY_ENV}), or listen on 127.0.0.1")
    sock = bind(host, port)
    try:
        service = open_local(choice, progress, warn=lambda line: print(f"specchat: warning: {line}", file=sys.stderr))
    except BaseException:
        sock.close()
        raise
    pair, model_id = service.pair, _model_id(choice)
    worker = Worker(max_waiting)
    logging.basicConfig(level=logging.WARNING, format="specchat: %(levelname)s: %(message)s")
    server = _Server(uvicorn.Config(create_app(service, model_id, worker, api_key), log_level="warning",
                                    access_log=False, timeout_graceful_shutdown=GRACE_S), worker)
    name = f"[{host}]" if ":" in host else host
    print(f"specchat: serving {model_id} ({pair.name}) on http://{name}:{sock.getsockname()[1]}/v1",
          file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        # Models are freed only once no step is running in them.
        if worker.stop(STOP_WAIT_S):
            service.close()


class _Server(uvicorn.Server):
    """uvicorn's server, which on Ctrl+C or SIGTERM first cancels the generations, so that the requests
    they serve end now and the graceful shutdown has nothing to wait for."""

    def __init__(self, config: uvicorn.Config, worker: Worker) -> None:
        super().__init__(config)
        self.worker = worker

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.worker.cancel_all()
        super().handle_exit(sig, frame)


def is_loopback(host: str) -> bool:
    """Whether every address the name stands for is this machine's own (127.0.0.0/8, ::1)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise SpecchatError(f"--host {host}: {e.strerror}; give an address such as 127.0.0.1") from None
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise SpecchatError(f"cannot listen on {host} port {port}: {e.strerror}; pick another --port") from None
    return sock


def _model_id(choice: ModelChoice) -> str:
    """What /v1/models calls the served model: the pair's name, or the target file's."""
    if choice.target is not None:
        return choice.target.stem
    return choice.pair or load_catalog().default_pair
