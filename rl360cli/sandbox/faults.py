"""Fault injection: a provider that fails a set fraction of the starts and execs of the one it wraps.

Which attempt's which operation fails is a pure function of (seed, attempt id, operation), so a run
with injected failures is reproducible. Every injected failure is an infra failure with cause
`injected`: masked from the loss, counted by cause.

    provider = FaultInjector(ProcessProvider(config), rate=0.2, seed=3)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rl360cli.sandbox.provider import ExecResult, Sandbox, SandboxProvider, WrappedProvider, WrappedSandbox
from rl360cli.sandbox.taxonomy import Event, SandboxError

if TYPE_CHECKING:
    from rl360cli.sandbox.task import Task


def injection_fires(seed: int, rate: float, attempt_id: str, operation: str) -> bool:
    """Whether the failure injected for (attempt, operation) fires: a pure function, so runs are reproducible."""
    if rate <= 0:
        return False
    digest = hashlib.sha256(f"{seed}:{attempt_id}:{operation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


class FaultInjector(WrappedProvider):
    """Fails `rate` of the starts and execs of the provider it wraps with `InfraCause.INJECTED`."""

    def __init__(self, inner: SandboxProvider, *, rate: float, seed: int = 0):
        super().__init__(inner)
        self.rate = rate
        self.seed = seed
        self.injected: list[tuple[str, str]] = []

    async def start(self, task: Task, *, attempt_id: str, labels: Mapping[str, str],
                    node: str | None = None) -> Sandbox:
        if injection_fires(self.seed, self.rate, attempt_id, "start"):
            self.injected.append((attempt_id, "start"))
            raise SandboxError(Event.INJECTED, "injected sandbox start failure", node=node, injected=True)
        sandbox = await self.inner.start(task, attempt_id=attempt_id, labels=labels, node=node)
        return _InjectedSandbox(sandbox, self)

    async def detach(self, sandbox: Sandbox) -> dict[str, Any]:
        inner = sandbox.inner if isinstance(sandbox, _InjectedSandbox) else sandbox
        return await self.inner.detach(inner)


class _InjectedSandbox(WrappedSandbox):
    def __init__(self, inner: Sandbox, injector: FaultInjector):
        super().__init__(inner)
        self.injector = injector
        self._execs = 0

    async def exec(self, command: str, *, timeout_s: float, env: Mapping[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        self._execs += 1
        operation = f"exec{self._execs}"
        if injection_fires(self.injector.seed, self.injector.rate, self.attempt_id, operation):
            self.injector.injected.append((self.attempt_id, operation))
            raise SandboxError(Event.INJECTED, f"injected failure of exec #{self._execs}", node=self.node,
                               injected=True)
        return await super().exec(command, timeout_s=timeout_s, env=env, user=user)
