"""The spec's ``tls:`` section: which hops speak TLS, and the files each end reads.

    tls:
      ca_file: /etc/gpufed/tls/ca.crt          # the CA every client checks servers against
      cert_file: /etc/gpufed/tls/client.crt    # the client certificate Prometheus and
      key_file: /etc/gpufed/tls/client.key     #   Alertmanager present (mutual TLS)
      server_name: gpufed.internal             # optional: the name checked in every server cert
      hops:                                    # each on by default once the section is there
        scrape: true                           # children -> exporters (true, false or job names)
        http_sd: true                          # children and master -> controller (http_sd_configs)
        remote_write: true                     # children -> master (the spec's remote_write)
        long_term: true                        # master -> Thanos Receive / VictoriaMetrics
        alertmanager: true                     # master -> every Alertmanager replica
        relay: true                            # Alertmanager -> the DingTalk relay
        gossip: true                           # Alertmanager <-> Alertmanager (with serve only)
      serve:                                   # optional: children, master and Alertmanagers serve
        cert_file: /etc/gpufed/tls/server.crt  #   TLS from tls/web-config.yml (--web.config.file)
        key_file: /etc/gpufed/tls/server.key
        client_auth_type: RequireAndVerifyClientCert

Secrets are only ever paths the processes read (absolute, as the other credential files).
Nothing here renders a whole config: :meth:`TlsSpec.client_config` is the ``tls_config``
block Prometheus and Alertmanager share (prometheus/common's ``TLSConfig``), and
:meth:`TlsSpec.web_config` the exporter-toolkit web-config document (the format
``webconfig.model`` parses). Whether a hop's URLs say ``https`` is checked where the URLs
live (``sharder.model.spec.FederationSpec``, ``federation.spec.GpufedSpec``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from sharder.kernel.errors import preview
from sharder.kernel.models import StrictModel

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
#: Where ``gpufed render`` writes the web-config the children, the master and the
#: Alertmanagers run with (``--web.config.file``); one file, its paths absolute.
WEB_CONFIG_FILE = "tls/web-config.yml"
#: An HTTP client config (Prometheus' ``http_config``) with the section's ``tls_config``: what
#: ``promtool check ready`` and ``amtool`` read (``--http.config.file``) in health checks.
HTTP_CLIENT_FILE = "tls/http-client.yml"
#: Alertmanager's gossip TLS (``--cluster.tls-config``): each replica serves the ``serve``
#: certificate to its peers and presents the client certificate to them (mutual TLS).
CLUSTER_TLS_FILE = "tls/cluster-tls.yml"


def _absolute(path: str) -> str:
    if not path.startswith("/") or not path.isprintable():
        raise ValueError(f"TLS files are absolute paths the processes read, got {preview(path)}")
    return path


TlsFile = Annotated[str, AfterValidator(_absolute)]


class TlsHops(StrictModel):
    """Which connections use the ``tls`` section's client settings (and ``https``)."""

    scrape: bool | list[str] = Field(
        default=True, description="children -> exporters: every job (true), none, or the jobs named"
    )
    http_sd: bool = True
    remote_write: bool = True
    long_term: bool = True
    alertmanager: bool = True
    relay: bool = True
    gossip: bool = Field(
        default=True, description="Alertmanager replicas' cluster mesh (--cluster.tls-config); needs serve"
    )


class TlsServeSpec(StrictModel):
    """The web-config the children, the master and the Alertmanagers serve with."""

    cert_file: TlsFile
    key_file: TlsFile
    client_ca_file: TlsFile | None = Field(default=None, description="default: the tls section's ca_file")
    client_auth_type: ClientAuthType = "RequireAndVerifyClientCert"
    min_version: Literal["TLS12", "TLS13"] | None = None


class TlsSpec(StrictModel):
    ca_file: TlsFile
    cert_file: TlsFile | None = None
    key_file: TlsFile | None = None
    server_name: str | None = Field(default=None, min_length=1)
    hops: TlsHops = Field(default_factory=TlsHops)
    serve: TlsServeSpec | None = None

    @field_validator("server_name")
    @classmethod
    def _server_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.isprintable() or any(c.isspace() for c in value)):
            raise ValueError(f"server_name is a host name, got {preview(value)}")
        return value

    @model_validator(mode="after")
    def _pairs(self) -> TlsSpec:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: a client certificate needs its key")
        serve = self.serve
        required = ("RequireAndVerifyClientCert", "RequireAnyClientCert")
        if serve is not None and serve.client_auth_type in required and self.cert_file is None:
            raise ValueError(
                f"serve.client_auth_type {serve.client_auth_type} needs a client certificate from every"
                " caller: set cert_file and key_file (or a client_auth_type that does not require one)"
            )
        return self

    def scrapes(self, job: str) -> bool:
        """Whether the job named ``job`` is scraped over TLS."""
        scrape = self.hops.scrape
        return scrape if isinstance(scrape, bool) else job in scrape

    def client_config(self) -> dict[str, Any]:
        """The ``tls_config`` block of a Prometheus or Alertmanager HTTP client."""
        config: dict[str, Any] = {"ca_file": self.ca_file}
        if self.cert_file is not None:
            config["cert_file"] = self.cert_file
            config["key_file"] = self.key_file
        if self.server_name is not None:
            config["server_name"] = self.server_name
        return config

    def http_client_config(self) -> dict[str, Any]:
        """Prometheus' ``http_config`` document: ``promtool``/``amtool --http.config.file``."""
        return {"tls_config": self.client_config()}

    def web_config(self) -> dict[str, Any] | None:
        """exporter-toolkit's web-config document, or None when nothing serves TLS."""
        serve = self.serve
        if serve is None:
            return None
        server: dict[str, Any] = {
            "cert_file": serve.cert_file,
            "key_file": serve.key_file,
            "client_auth_type": serve.client_auth_type,
        }
        if serve.client_auth_type != "NoClientCert":
            server["client_ca_file"] = serve.client_ca_file or self.ca_file
        if serve.min_version is not None:
            server["min_version"] = serve.min_version
        return {"tls_server_config": server}

    def cluster_tls_config(self, peer_name: str | None = None) -> dict[str, Any] | None:
        """Alertmanager's ``--cluster.tls-config`` document (gossip over mutual TLS), or None
        when the replicas gossip in the clear (no ``serve``, or the ``gossip`` hop off).

        Both sides of the mesh in one file: the server part is the web config's, the client
        part the section's client settings, so a replica joins only peers that trust it.
        Gossip dials the peers' IP addresses (memberlist resolves ``--cluster.peer`` names
        first), so without ``server_name`` the client checks ``peer_name`` (a replica's host
        name, in the one server certificate every replica serves) instead of an IP that no
        certificate from ``gpufed certs --host <service>`` carries.
        """
        web = self.web_config()
        if web is None or not self.hops.gossip:
            return None
        client = self.client_config()
        if "server_name" not in client and peer_name is not None:
            client["server_name"] = peer_name
        return {"tls_server_config": web["tls_server_config"], "tls_client_config": client}
