"""Template filters for the console (``couponcenter.core.humanize``, and a lateness percentile
as the histogram knows it: ``overview.lateness_text``)."""

from django import template

from couponcenter.core.humanize import ms_age, when
from couponcenter.ops.overview import lateness_text

register = template.Library()
register.filter("ms_age", ms_age)
register.filter("when", when)
register.filter("lateness", lateness_text)
