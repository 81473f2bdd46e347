"""Each knob of a timeout topic is defined once (``reminders.engine.knobs``,
``timeout_topic_rules.TIMEOUT_TOPIC_KNOBS``): the engine's defaults, the spec's, the model's
fields and the API's fields all say what the knob says."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from reminders.api.timeout_topics import TopicInputSerializer, TopicOutputSerializer
from reminders.engine.knobs import TOPIC_KNOBS
from reminders.engine.topic_model import TopicSettings
from reminders.models import TimeoutTopic
from reminders.timeout_topic_rules import TIMEOUT_TOPIC_KNOBS, TimeoutTopicSpec


def test_every_place_takes_a_knob_default_and_help_from_its_definition():
    spec = TimeoutTopicSpec(name="t.knobs", type="log")
    engine = TopicSettings()
    for knob in TOPIC_KNOBS:
        assert getattr(engine, knob.name) == knob.default
    inputs, outputs = TopicInputSerializer().fields, TopicOutputSerializer().fields
    for knob in TIMEOUT_TOPIC_KNOBS:
        field = TimeoutTopic._meta.get_field(knob.name)
        assert field.default == getattr(spec, knob.name) == knob.default
        assert field.help_text == inputs[knob.name].help_text == knob.help
        assert not inputs[knob.name].required
        assert outputs[knob.name].help_text == knob.help


@pytest.mark.parametrize("knob", TIMEOUT_TOPIC_KNOBS, ids=lambda knob: knob.name)
def test_the_model_refuses_a_knob_outside_its_range(knob):
    for value in (knob.low - 1, knob.high + 1):
        if value < 0:
            continue  # a PositiveIntegerField refuses it whatever the knob says
        topic = TimeoutTopic(name="t.knobs", type="log", **{knob.name: value})
        with pytest.raises(ValidationError) as refused:
            topic.clean_fields()
        assert knob.name in refused.value.message_dict
