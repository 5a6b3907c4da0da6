"""Bad image requests answered in the API server as bad requests (HTTP 400), never by
the engine.

Two checks vLLM 0.33 lacks or gets wrong for a TT generator:

**Placeholders without an image.** The chat template writes an image's placeholder tokens
(`<|image_pad|>` for Qwen-VL) for each image sent; a client can also type them, or send
token ids holding them. vLLM passes such a prompt on, and the generator then finds
placeholders no image fills (TT-Metal's classes fail on it, and the engine with them).
`check_placeholders` refuses the request instead: every placeholder token must lie in a
placeholder range of an item of its modality.

**URL errors.**
vLLM 0.33's media connector, which loads `image_url`s in the API server, raises two
client mistakes as exceptions its OpenAI server does not map to 400:
- a `file://` URL without `--allowed-local-media-path` raises `RuntimeError`: the client
  gets a 500 and uvicorn drops the connection ("Exception in ASGI application");
- a data URL that is not base64 raises `NotImplementedError`: a 501.
Both are the client's to fix, so both become `VLLMValidationError` (400, `param:
image_url`) with a message saying what to send instead. Everything else the connector
does, including vLLM's own choice to answer an unreachable http URL with a 500 (a
transient failure a client may retry), is left as it is.

**Inside addresses.** An http(s) `image_url` is fetched only from public addresses
unless the operator allows more (`serving.api_server.media_urls`, TTB220): every `MediaConnector`
that would fetch through vLLM's global connection fetches through a guarded one instead.

`install()` wraps the private methods once per process, and sets the URL policy each
time; the platform calls it in every process that plans a TT configuration (the API
server among them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_state: dict[str, bool] = {}

# Where each family's config names its placeholder tokens (Qwen-VL, Gemma 3 / LLaVA).
_PLACEHOLDER_KEYS = {
    "image": ("image_token_id", "image_token_index"),
    "video": ("video_token_id", "video_token_index"),
}


def placeholder_tokens(hf_config: Any) -> dict[int, str]:
    """The placeholder token ids of a multimodal checkpoint, with their modality."""
    found: dict[int, str] = {}
    for modality, keys in _PLACEHOLDER_KEYS.items():
        for key in keys:
            value = getattr(hf_config, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                found[value] = modality
                break
    return found


def check_placeholders(
    token_ids: Sequence[int], placeholders: Mapping[str, Sequence[Any]], tokens: Mapping[int, str]
) -> None:
    """Raise `VLLMValidationError` when a placeholder token lies outside every
    placeholder range of its modality (`placeholders`: modality -> ranges with `offset`
    and `length`, as vLLM's processor records them)."""
    if not tokens:
        return
    stray: dict[str, int] = {}
    covered: dict[str, set[int]] = {}
    for index, token in enumerate(token_ids):
        modality = tokens.get(token)
        if modality is None:
            continue
        if modality not in covered:
            covered[modality] = {
                i
                for r in placeholders.get(modality, ())
                for i in range(r.offset, r.offset + r.length)
            }
        if index not in covered[modality]:
            stray[modality] = stray.get(modality, 0) + 1
    if stray:
        from vllm.exceptions import VLLMValidationError

        what = ", ".join(f"{n} {m} placeholder token(s)" for m, n in stray.items())
        raise VLLMValidationError(
            f"the prompt holds {what} that no {'/'.join(stray)} sent with it fills; the chat "
            "template writes the placeholders for each image: remove them from the text",
            parameter="messages",
        )


def install(allow_private_media_urls: bool | list[str] = False) -> None:
    """Put the checks in place in this process, with `allow_private_media_urls`
    (`ServerOptions`) as the policy for image URLs."""
    from ttbundles.serving.api_server import media_urls

    media_urls.set_policy(media_urls.MediaURLPolicy.from_option(allow_private_media_urls))
    if _state.get("installed"):
        return
    from vllm.exceptions import VLLMValidationError

    from ttbundles.serving import compat

    _, default_connection = compat.http_connection()
    original_init: Any = None

    def _init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if self.connection is default_connection:
            self.connection = media_urls.guarded_connection()

    original_init = compat.replace_media_connector_init(_init)

    _, load_file, load_data = compat.media_connector_loaders()

    def _load_file_url(self: Any, url_spec: Any, media_io: Any) -> Any:
        if self.allowed_local_media_path is None:
            raise VLLMValidationError(
                "file:// URLs are not allowed on this server; send the image as a data URL "
                "(data:image/png;base64,...) or an http(s) URL, or start vllm serve with "
                "--allowed-local-media-path DIR to serve files under DIR",
                parameter="image_url",
            )
        return load_file(self, url_spec, media_io)

    def _load_data_url(self: Any, url: str, media_io: Any) -> Any:
        try:
            return load_data(self, url, media_io)
        except NotImplementedError as error:
            raise VLLMValidationError(
                f"{error} Write the image as data:<media type>;base64,<data>",
                parameter="image_url",
            ) from error

    compat.replace_media_connector_loaders(_load_file_url, _load_data_url)
    _state["installed"] = True
