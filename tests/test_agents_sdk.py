"""The OpenAI Agents SDK, whose default model speaks the Responses API, runs an agent with a
function tool through the gateway against every channel type: it calls the tool, gets its
result back to the model, and reads the final answer."""

from __future__ import annotations

import pytest

from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import Target, target_param

agents = pytest.importorskip("agents", reason="openai-agents is not installed")
openai_provider = pytest.importorskip("agents.models.openai_provider")


@target_param
@pytest.mark.parametrize("wiring", ["explicit", "default"])
@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
async def test_an_agent_with_a_function_tool(
    gateway: ServedGateway,
    target: Target,
    stream: bool,
    wiring: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``explicit``: the Responses model given its client; ``default``: the agent names only
    its model, and the runner's default provider builds its client from OPENAI_BASE_URL and
    OPENAI_API_KEY, as a user who changes nothing else sets it up."""
    import openai

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather now in a city."""
        calls.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=KEYS["alice"], max_retries=0)
    model: str | agents.Model = agents.OpenAIResponsesModel(
        model=target.model, openai_client=client
    )
    if wiring == "default":
        monkeypatch.setenv("OPENAI_BASE_URL", gateway.v1)
        monkeypatch.setenv("OPENAI_API_KEY", KEYS["alice"])
        model = target.model
        # the SDK shares one HTTP client per process, made in the first test's event loop
        monkeypatch.setattr(openai_provider, "_http_client", None)
    agent = agents.Agent(
        name="forecaster", instructions="Use the tool.", model=model, tools=[get_weather]
    )
    config = agents.RunConfig(tracing_disabled=True)
    prompt = "[[fake tools=1]] weather?"
    if stream:
        run = agents.Runner.run_streamed(agent, prompt, run_config=config)
        async for _ in run.stream_events():
            pass
        final = run.final_output
    else:
        result = await agents.Runner.run(agent, prompt, run_config=config)
        final = result.final_output
    await client.close()
    if wiring == "default" and openai_provider._http_client is not None:
        await openai_provider._http_client.aclose()  # the one this test's runner made
    assert len(calls) == 1  # the agent ran the tool the model called
    assert isinstance(final, str) and final  # and the model answered after its result
