"""Where a model comes from: a local directory, or a Hugging Face id `org/name[@revision]` resolved to a snapshot in
the Hugging Face cache by huggingface_hub (downloaded there first when it is missing and the network is allowed).

Only the files this tool reads are fetched (JSON, safetensors, tokenizer files; never pickles). huggingface_hub's own
settings apply: `HF_HUB_CACHE`/`HF_HOME` say where the cache is, `HF_HUB_OFFLINE=1` forbids the network, `HF_TOKEN`
(or `hf auth login`) opens gated models. The resolved commit is returned so that outputs can record it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

# the files a model directory needs here: config and generation JSON, safetensors weights and their index, tokenizers
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja", "*.tiktoken"]
# `org/name` or `org/name@revision`, as the Hub names repositories (a path that exists is always taken as a path)
_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")


@dataclass(frozen=True)
class ModelSource:
    path: Path  # a local directory holding config.json, the weights and the tokenizer
    repo_id: str | None = None  # the Hugging Face id it was resolved from; None for a local directory
    revision: str | None = None  # the snapshot's commit hash

    @property
    def spec(self) -> str:
        """How to name this model again, exactly: `org/name@commit`, or the local directory's absolute path."""
        return f"{self.repo_id}@{self.revision}" if self.repo_id else str(self.path.resolve())


def resolve_model(spec: str | Path) -> ModelSource:
    """A local directory as it is; otherwise a Hugging Face id, resolved through the cache (see the module docstring).
    Anything else, or an id that cannot be resolved, is one UserError naming it and what to do."""
    path = Path(spec)
    match = _ID.match(str(spec))
    if path.exists() or match is None:
        return ModelSource(path)
    repo, revision = match["repo"], match["rev"]
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(repo, revision=revision, allow_patterns=MODEL_FILES))
    except Exception as e:  # noqa: BLE001 — huggingface_hub and its HTTP client raise many types; each becomes a line
        raise UserError(_hub_error(str(spec), repo, revision, e)) from None
    return ModelSource(snapshot, repo, snapshot.name)


# What huggingface_hub's HTTP client raises, by class name (requests in older huggingface_hub releases, an httpx in
# newer ones): the connection never opened, or a download broke off (huggingface_hub retries a broken
# download, then raises the last error; a file of the wrong size is an OSError saying "Consistency check failed").
_UNREACHABLE = {"ConnectError", "ConnectTimeout", "PoolTimeout", "ProxyError", "SSLError"}
_INTERRUPTED = {
    "RemoteProtocolError",
    "ReadTimeout",
    "ReadError",
    "WriteError",
    "WriteTimeout",
    "ChunkedEncodingError",
    "IncompleteRead",
    "ProtocolError",
}


def _http_failure(e: Exception) -> str | None:
    """The kind of a failed download: unreachable, interrupted or incomplete (a file of the wrong size); else None."""
    names = {c.__name__ for c in type(e).__mro__}
    if isinstance(e, OSError) and "Consistency check failed" in str(e):
        return "incomplete"
    return "interrupted" if names & _INTERRUPTED else "unreachable" if names & _UNREACHABLE else None


def _hub_error(spec: str, repo: str, revision: str | None, e: Exception) -> str:
    """One line for why `repo` could not be resolved, with the way out."""
    from huggingface_hub import errors

    rev = f" --revision {revision}" if revision else ""
    fetch = f"download it with `hf download {repo}{rev} --local-dir DIR` and give DIR"
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    if isinstance(e, errors.LocalEntryNotFoundError | errors.OfflineModeIsEnabled):
        return (
            f"{spec} is not a local directory, and the Hugging Face model {repo} is not in the cache while the "
            f"network is off (HF_HUB_OFFLINE); {fetch}, or allow downloads"
        )
    if isinstance(e, errors.RevisionNotFoundError):
        return f"the Hugging Face model {repo} has no revision {revision!r}; give a branch, tag or commit it has"
    if isinstance(e, errors.GatedRepoError):  # a RepositoryNotFoundError too: checked first
        return (
            f"the Hugging Face model {repo} is gated and this machine has no access to it: accept its terms at "
            f"https://huggingface.co/{repo}, then log in with `hf auth login` (or set HF_TOKEN) as that "
            "account"
        )
    if isinstance(e, errors.RepositoryNotFoundError):  # also a private repository without a token
        return (
            f"{spec} is not a local directory, and {repo} is not a Hugging Face model this account can read "
            "(check the name; for a private model, log in with `hf auth login`)"
        )
    failure = _http_failure(e)
    if failure == "interrupted":
        return (
            f"the download of the Hugging Face model {repo} broke off ({first}); run the command again, which "
            f"resumes it from the cache, or {fetch}"
        )
    if failure == "incomplete":
        return (
            f"a file of the Hugging Face model {repo} arrived with the wrong size ({first}); fetch it afresh with "
            f"`hf download {repo}{rev} --force-download`, then run the command again"
        )
    if failure == "unreachable":
        return (
            f"{spec} is not a local directory, and the Hugging Face Hub cannot be reached to fetch {repo} "
            f"({first}); check the network, or {fetch}"
        )
    return (
        f"{spec} is not a local directory, and the Hugging Face model {repo} cannot be fetched ({first}); check "
        f"the network, or {fetch}"
    )
