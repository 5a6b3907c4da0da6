"""What ttbundles installs into vLLM's API server process, behind one `install`.

The API server checks and shapes requests before anything reaches the engine: image
requests and their placeholders (`image_requests`), media URLs only to the addresses the
policy allows (`media_urls`), length refusals that name the bundle's limit
(`length_limits`), the bundle's chat defaults (`chat_defaults`), a quiet requested stop
(`shutdown`), and the per-lane gauges on /metrics (`lane_metrics`, loaded by vLLM itself
as a stat-logger plugin). Each patch of vLLM goes through `serving.compat`, which says
on which releases it was checked.

Installed from the platform's configuration hook (`TTPlatform.check_and_update_config`),
with the plan it made: the imports stay inside the functions, since the platform module is
loaded in every process of vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ttbundles.serving.planning.plan import Plan


def install_stop_handling() -> None:
    """Once, in `vllm serve`: requests in flight end when the server is asked to stop
    (vLLM 0.33 can leave them open forever on SIGTERM), and a requested stop is quiet."""
    from ttbundles.serving.api_server.shutdown import (
        drop_shutdown_echo,
        end_open_requests_on_shutdown,
    )

    end_open_requests_on_shutdown()
    drop_shutdown_echo()


def install(plan: Plan, *, planning: bool = False) -> None:
    """The request checks and defaults of `plan`, in this process. `planning` (`ttbundle
    plan`) installs nothing that only a running server's handlers read."""
    from ttbundles.serving.api_server import image_requests

    image_requests.install(plan.server_options.allow_private_media_urls)
    if plan.chat and not planning:
        from ttbundles.serving.api_server import chat_defaults

        chat_defaults.install(plan.chat)
    capped = plan.capped_length()
    if capped is not None:
        from ttbundles.serving.api_server import length_limits

        length_limits.explain_lowered_length(plan, *capped)
