"""Template filters for the console (``couponcenter.core.humanize``)."""

from django import template

from couponcenter.core.humanize import ms_age, when

register = template.Library()
register.filter("ms_age", ms_age)
register.filter("when", when)
