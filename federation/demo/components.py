"""The command line of every process the demo starts: pure, from the plan and rendered files.

Each function returns a :class:`Launch` (name, argv, extra environment, the URL that
answers 200 once it serves). Python components run with the demo's own interpreter
(``sys.executable -m ...``), so a virtualenv or a ``PYTHONPATH`` checkout applies to them
as it does to the demo. Prometheus and Alertmanager run the flags gpufed renders
(``master/flags.json``, ``alertmanager.ha``), with ``0.0.0.0`` listen addresses moved to
loopback: the demo serves nothing beyond this machine. With ``tls`` (``gpufed demo --tls``)
every server runs the rendered web config (client certificates required) and every gpufed
client the rendered HTTP client file, and the ready URLs say https.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from federation.demo.plan import Layout, TlsFiles, url

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Launch:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    ready_url: str | None = None
    ready_timeout: float = 90.0


def python(module: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", module, *args)


def loopback(flags: Sequence[str]) -> list[str]:
    """Listen flags bound to every interface -> bound to loopback only."""
    return [
        flag.replace("=0.0.0.0:", f"={LOOPBACK}:") if "listen-address=" in flag else flag for flag in flags
    ]


def controller(
    *,
    spec: Path,
    data_dir: Path,
    port: int,
    token: str,
    child_urls: Mapping[str, str],
    child_url_template: str,
    consul: str | None,
    extra_args: Sequence[str] = (),
    tool_path: str | None = None,
    tls: TlsFiles | None = None,
) -> Launch:
    args = [
        "serve",
        f"--spec={spec}",
        f"--data-dir={data_dir}",
        f"--listen={LOOPBACK}:{port}",
        f"--child-url-template={child_url_template}",
        *(f"--child-url={child}={address}" for child, address in sorted(child_urls.items())),
    ]
    if tls is not None:  # serves TLS; its calls to the children present the client certificate
        args += [f"--web.config.file={tls.web_config}", f"--http.config.file={tls.http_config}"]
    if consul:
        args.append(f"--consul={consul}")
    args.extend(extra_args)
    # The token goes through the environment: a flag would show in `ps` to every user.
    return Launch(
        name="controller",
        argv=python("federation.commands.cli", *args),
        # tool_path: the promtool/amtool of the demo's lines first, for the controller's checks.
        env={"GPUFED_TOKEN": token, **({"PATH": tool_path} if tool_path else {})},
        ready_url=url(port, "/healthz", tls=tls is not None),
    )


def fleet(*, layout: Layout, port: int, consul: str | None, register_url: str, token: str,
          tls: TlsFiles | None = None) -> Launch:
    """The simulated fleet; it registers its nodes itself, in Consul or with the controller."""
    args = [
        "fleet",
        f"--nodes={layout.nodes}",
        f"--gpus={layout.gpus}",
        f"--regions={layout.regions}",
        f"--listen={LOOPBACK}:{port}",
    ]
    env: dict[str, str] = {}
    if consul:
        args.append(f"--consul={consul}")
    else:
        args.append(f"--register-url={register_url}")
        env["GPUFED_EXPORTER_REGISTER_TOKEN"] = token
        if tls is not None:  # the controller requires a client certificate
            args.append(f"--register-http-config-file={tls.http_config}")
    if tls is not None:
        args.append(f"--web.config.file={tls.web_config}")
    ready = url(port, "/readyz", tls=tls is not None)  # every node collected once
    return Launch(name="fleet", argv=python("exporter", *args), env=env, ready_url=ready, ready_timeout=180)


def relay(*, config: Path, port: int, credentials: Mapping[str, str], data_dir: Path,
          tls: TlsFiles | None = None) -> Launch:
    """The DingTalk relay; ``data_dir`` keeps its ordering/dedup memory across restarts."""
    return Launch(
        name="relay",
        argv=python("alertmanager.dingtalk", f"--config={config}", f"--listen={LOOPBACK}:{port}",
                    f"--data-dir={data_dir}", "--log-level=warning", *_web(tls)),
        env=dict(credentials),
        ready_url=url(port, "/readyz", tls=tls is not None),
    )


def _web(tls: TlsFiles | None) -> tuple[str, ...]:
    return () if tls is None else (f"--web.config.file={tls.web_config}",)


def alertmanager(
    *, binary: str, name: str, flags: Sequence[str], config: Path, storage: Path, port: int,
    tls: TlsFiles | None = None,
) -> Launch:
    return Launch(
        name=f"alertmanager-{name.removeprefix('am-')}",
        argv=(binary, f"--config.file={config}", f"--storage.path={storage}", *loopback(flags),
              "--log.level=warn", *_web(tls),
              *(() if tls is None else (f"--cluster.tls-config={tls.cluster_config}",))),
        ready_url=url(port, "/-/ready", tls=tls is not None),
    )


#: Demo-only: Prometheus re-sends firing alerts every minute by default, and its first send
#: can come before it has found the Alertmanagers, so the first heartbeat would wait 1 min.
MASTER_DEMO_FLAGS = ("--rules.alert.resend-delay=10s",)


def master(
    *, binary: str, config: Path, flags: Sequence[str], port: int, tls: TlsFiles | None = None
) -> Launch:
    return Launch(
        name="master",
        argv=(binary, f"--config.file={config}", *loopback(flags), *MASTER_DEMO_FLAGS, "--log.level=warn",
              *_web(tls)),
        ready_url=url(port, "/-/ready", tls=tls is not None),
    )


def child(*, binary: str, name: str, config: Path, wal: Path, port: int, agent_flag: str,
          tls: TlsFiles | None = None) -> Launch:
    """One agent-mode child, as the controller's published config says, with reloads allowed;
    ``agent_flag`` as the spec's Prometheus release spells it."""
    return Launch(
        name=f"child/{name}",
        argv=(binary, f"--config.file={config}", f"--storage.agent.path={wal}",
              f"--web.listen-address={LOOPBACK}:{port}", agent_flag, "--web.enable-lifecycle",
              "--log.level=warn", *_web(tls)),
        ready_url=url(port, "/-/ready", tls=tls is not None),
    )
