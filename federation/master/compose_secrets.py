"""Files Alertmanager reads secrets from, for ``--target compose``: one folder, mounted read-only.

Called by ``federation.master.compose.render_compose_bundle``. The alerting spec names its
secrets as files only (WeCom ``api_secret_file``, a webhook's ``credentials_file``, an
e-mail's ``auth_password_file``), and Alertmanager reads them inside its container, so
every Alertmanager service mounts the operator's folder (``GPUFED_ALERTMANAGER_SECRETS_DIR``)
at ``/etc/alertmanager/secrets``, where those paths must point. A path anywhere else would
point at nothing in the container, so it is refused at render time with the spec's field
named. Without such a file in the spec nothing is mounted and the variable is not asked for.
Pure: the spec in, (field, path) pairs and services changed in place out.
"""

from __future__ import annotations

from typing import Any

from alertmanager.models import AlertingSpec
from sharder.kernel.errors import OutputError

SECRETS_MOUNT = "/etc/alertmanager/secrets"
SECRETS_ENV = "GPUFED_ALERTMANAGER_SECRETS_DIR"
SECRETS_HELP = (
    f"the folder of files Alertmanager reads secrets from (the spec's api_secret_file,"
    f" credentials_file, auth_password_file), mounted read-only at {SECRETS_MOUNT}"
)


def secret_files(alerting: AlertingSpec | None) -> dict[str, str]:
    """Every secret file the alerting spec names: the spec's field -> the path, in spec order."""
    if alerting is None:
        return {}
    found: dict[str, str] = {}
    for i, receiver in enumerate(alerting.receivers):
        where = f"alerting.receivers[{i}]"
        for j, hook in enumerate(receiver.webhooks):
            if hook.credentials_file:
                found[f"{where}.webhooks[{j}].credentials_file"] = hook.credentials_file
        for j, email in enumerate(receiver.emails):
            if email.auth_password_file:
                found[f"{where}.emails[{j}].auth_password_file"] = email.auth_password_file
        for j, wecom in enumerate(receiver.wecom):
            found[f"{where}.wecom[{j}].api_secret_file"] = wecom.api_secret_file
    return found


def check_paths(files: dict[str, str]) -> None:
    """Every secret file must sit inside the mounted folder, or Alertmanager reads nothing."""
    for field, path in files.items():
        if not path.startswith(f"{SECRETS_MOUNT}/") or "/../" in f"{path}/":
            raise OutputError(
                f"{field} is {path!r}; compose mounts {SECRETS_ENV} at {SECRETS_MOUNT} in every"
                f" Alertmanager: write {SECRETS_MOUNT}/{path.rstrip('/').rsplit('/', 1)[-1]}"
            )


def mount(secrets_dir: str) -> dict[str, Any]:
    return {"type": "bind", "source": secrets_dir, "target": SECRETS_MOUNT, "read_only": True}


def mount_into(services: dict[str, dict[str, Any]], kinds: dict[str, str], *, secrets_dir: str) -> None:
    """The folder into every Alertmanager service (``kinds``: host -> kind of service)."""
    for host, kind in kinds.items():
        if kind == "alertmanager" and host in services:
            services[host]["volumes"].append(mount(secrets_dir))
