"""The intake's event input without the serializer (intake.serializers.event_create_input) accepts only
what EventCreateInput accepts, with the same validated data; everything else goes to the serializer."""
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from intake.serializers import EventCreateInput, event_create_input
from tests.fuzzing import SEED

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=6)
_segment = st.text("abcXYZ019_", min_size=1, max_size=4)
_types = (st.lists(_segment, min_size=1, max_size=4).map(".".join)
          | st.sampled_from(["herald.test", "herald.x", " invoice.paid ", "invoice.paid\n", "", "a..b", "a.*",
                             "x" * 201, "é.a", "a" * 200])
          | st.integers() | st.none() | st.booleans() | st.text(max_size=6))
_channel = (st.text("abz09_.:-", min_size=1, max_size=6)
            | st.sampled_from([" eu", "eu\n", "", "x" * 129, "a/b", "é"]) | st.integers() | st.none())
_channels = st.lists(_channel, max_size=7) | st.none() | st.text(max_size=3) | st.just({"a": 1})


@st.composite
def _inputs(draw):
    if draw(st.integers(0, 20)) == 0:
        return draw(_json)  # not an object at all
    data = {}
    if draw(st.booleans()) or draw(st.booleans()):
        data["type"] = draw(_types)
    if draw(st.integers(0, 5)):
        data["data"] = draw(_json)
    if draw(st.booleans()):
        data["channels"] = draw(_channels)
    if draw(st.integers(0, 5)) == 0:
        data["extra"] = draw(_json)
    return data


@seed(SEED)  # fresh each run, printed in pytest's header (tests/fuzzing.py)
@settings(max_examples=600, deadline=None)
@given(_inputs())
def test_what_the_fast_path_accepts_the_serializer_accepts_the_same(data):
    fast = event_create_input(data)
    if fast is None:
        return
    serializer = EventCreateInput(data=data)
    assert serializer.is_valid(), serializer.errors
    assert fast == dict(serializer.validated_data)
    assert [type(value) for value in fast.values()] == [type(serializer.validated_data[k]) for k in fast]


def test_the_requests_clients_send_take_the_fast_path():
    assert event_create_input({"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 1200}}) == {
        "type": "invoice.paid", "data": {"invoice": "in_1", "amount": 1200}, "channels": []}
    assert event_create_input({"type": "a.b", "data": [], "channels": ["eu", "tenant:42"]})["channels"] == [
        "eu", "tenant:42"]
    for refused in ({"type": "herald.test", "data": {}}, {"type": "a b", "data": {}}, {"type": "a"},
                    {"type": "a", "data": None}, {"type": "a", "data": 1, "channels": ["x"] * 6}, ["a"],
                    {"type": "a", "data": {"n": float("-inf")}}, {"type": "a", "data": [float("nan")]}):
        assert event_create_input(refused) is None


def test_the_quick_content_negotiation_answers_as_drf_s():
    from rest_framework.negotiation import DefaultContentNegotiation
    from rest_framework.renderers import JSONRenderer
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    from intake.negotiation import ApiContentNegotiation

    factory = APIRequestFactory()
    for path, headers in [("/x", {}), ("/x", {"HTTP_ACCEPT": "*/*"}), ("/x", {"HTTP_ACCEPT": "application/json"}),
                          ("/x", {"HTTP_ACCEPT": ""}), ("/x", {"HTTP_ACCEPT": "text/html"}),
                          ("/x?format=json", {}), ("/x?format=xml", {"HTTP_ACCEPT": "*/*"}),
                          ("/x", {"HTTP_ACCEPT": "application/json; indent=4"})]:
        answers = []
        for negotiation in (DefaultContentNegotiation(), ApiContentNegotiation()):
            try:
                renderer, media_type = negotiation.select_renderer(Request(factory.get(path, **headers)),
                                                                   [JSONRenderer()])
                answers.append((type(renderer), media_type))
            except Exception as exc:  # noqa: BLE001 - the same refusal, whatever it is
                answers.append(type(exc))
        assert answers[0] == answers[1], (path, headers, answers)


@pytest.mark.django_db(transaction=True)
def test_a_number_json_cannot_hold_is_a_400_not_a_500(api):
    # `-1e400` is valid JSON syntax that Python reads as -inf, which no JSON (nor the payload) can hold
    response = api.post("events", raw='{"type": "a.b", "data": {"n": -1e400}}', key="overflow-key-01")
    assert response.status_code == 400 and response.json()["code"] == "validation_error"
