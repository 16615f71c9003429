"""The rendezvous board on a Redis server: one key per run, namespaced by the run id, with an
expiry.

Redis sees a handful of commands per process at the start of a run and nothing afterwards.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from resnet50_trainer.errors import UserError

KEY_PREFIX = "resnet50_trainer"
CONNECT_TIMEOUT_S = 5.0
RETRIES = 1
URL_SCHEMES = ("redis://", "rediss://")
# Delete the key only if it still holds our entry: a newer run with the same id may have replaced
# it.
_WITHDRAW_IF_OURS = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class RedisBoard:
    def __init__(self, run_id: str, host: str, port: int, password: str | None):
        self.key = f"{KEY_PREFIX}:{run_id}:address"
        options: dict[str, Any] = dict(
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=CONNECT_TIMEOUT_S,
            # One retry, at once (a pooled connection may be stale): redis-py's default retries
            # with backoff took 75 s to give up on a server whose link was down.
            retry=Retry(NoBackoff(), RETRIES),
        )
        if password:
            options["password"] = password
        # redis://[:password@]host[:port][/db]; the password is never shown
        if host.startswith(URL_SCHEMES):
            url = urlsplit(host)
            self.where = f"redis {url.hostname}:{url.port or 6379}/{url.path.strip('/') or 0}"
            self.client = redis.Redis.from_url(host, **options)
        else:
            self.where = f"redis {host}:{port}"
            self.client = redis.Redis(host=host, port=port, **options)
        self._call(self.client.ping)

    def publish(self, entry: str, ttl_s: float | None) -> None:
        expiry = None if ttl_s is None else max(1, int(ttl_s * 1000))  # None: until withdrawn
        self._call(self.client.set, self.key, entry, px=expiry)

    def read(self) -> str | None:
        value = self._call(self.client.get, self.key)
        # Not UTF-8: a foreign value; the meeting ignores what does not decode as an entry.
        return None if value is None else value.decode(errors="replace")

    def withdraw(self, entry: str) -> None:
        self._call(self.client.eval, _WITHDRAW_IF_OURS, 1, self.key, entry)

    def _call(self, command, *args, **kwargs):
        try:
            return command(*args, **kwargs)
        except redis.AuthenticationError:
            raise UserError(
                f"{self.where} refused the password: check --redis_password "
                "(or $REDIS_PASSWORD, or the one in the redis:// URL)"
            ) from None
        except redis.RedisError as error:
            raise UserError(
                f"cannot use {self.where} for the rendezvous ({error}): start Redis "
                "there or fix --redis_host/--redis_port"
            ) from None
