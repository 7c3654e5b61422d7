"""Running onnxscript rules the one way every family does: counts per rule, then why candidates were declined.

A rule is a ``RewriteRuleClassBase`` with ``pattern`` / ``check`` / ``rewrite``; every declined candidate returns
``MatchResult().fail(reason, value)`` from ``check``. ``apply_rule_set`` applies the rules in order (each over the
whole graph, so a later rule sees the earlier rewrites), adds ``{rule.name: count}`` to the report, then makes a
dry run with a tracer that records the reason of every candidate still declined (shown by ``--verbose``).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRule, RewriteRuleSet

from .options import RewriteReport, RuleFailure

MAX_FAILURES_PER_RULE = 200

_OTHER_USES = "Matched nodes have other uses preventing replacement."


class _FailureTracer(MatchingTracer):
    """Collects every candidate match whose check failed, with the rule's reason (not just the best match)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[RuleFailure] = []
        self._seen: set[tuple[str, str, str]] = set()
        self._per_rule: dict[str, int] = {}

    def log(self, rule, container, node, match_result, status) -> None:  # MatchingTracer API
        if status == MatchStatus.NO_MATCH and match_result.reason != _OTHER_USES:
            return  # a structural mismatch: not a candidate
        if status == MatchStatus.SUCCESS:
            return
        name = rule.name or str(rule)
        node_name = node.name or f"<{node.op_type}>"
        reason = match_result.reason or ("replacement failed" if status == MatchStatus.REPLACEMENT_FAILED
                                         else "check failed")
        if reason == _OTHER_USES:
            reason = "an intermediate value has other consumers or is a graph output"
        key = (name, node_name, reason)
        if key in self._seen or self._per_rule.get(name, 0) >= MAX_FAILURES_PER_RULE:
            return
        self._seen.add(key)
        self._per_rule[name] = self._per_rule.get(name, 0) + 1
        self.failures.append(RuleFailure(rule=name, node=node_name, reason=reason))


def apply_rule_set(model: ir.Model, rules: RewriteRuleSet | Iterable[RewriteRule], report: RewriteReport,
                   *, collect_failures: bool = True) -> int:
    """Apply ``rules`` in order (each rule over the whole graph), add ``{rule.name: count}`` to ``report``, then
    record why the remaining candidate matches were declined. Returns the number of rewrites."""
    rule_list: list[RewriteRule] = list(rules)
    total = 0
    for rule in rule_list:
        n = RewriteRuleSet([rule]).apply_to_model(model)
        report.add(rule.name or str(rule), n)
        total += n
    if collect_failures and rule_list:
        tracer = _FailureTracer()
        RewriteRuleSet(rule_list).apply_to_model(model, tracer=tracer)  # a tracer makes this a dry run
        report.failures.extend(tracer.failures)
    return total
