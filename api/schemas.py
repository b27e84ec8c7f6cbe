"""JSON schemas of the API's bodies, for /openapi.json.

The job document's schema mirrors ``scheduler.model`` (which is what actually
validates); ``tests/api/test_openapi.py`` holds the two together: every field
the schema names is accepted by the model and every field outside it is
refused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMPONENTS", "JOB_DOCUMENT"]

# What scheduler.duration.parse_duration reads: units in the order d h m s, each once, each number
# with an optional fraction, or whole seconds. The total must be whole seconds, which no pattern says.
_DURATION = {"oneOf": [{"type": "string", "pattern": r"^(\d+|\d+(\.\d+)?d(\d+(\.\d+)?h)?(\d+(\.\d+)?m)?(\d+(\.\d+)?s)?|\d+(\.\d+)?h(\d+(\.\d+)?m)?(\d+(\.\d+)?s)?|\d+(\.\d+)?m(\d+(\.\d+)?s)?|\d+(\.\d+)?s)$"},
                       {"type": "integer", "minimum": 0}],
             "description": "90s, 5m, 1h30m, 2d, 1.5h (a whole number of seconds), or whole seconds"}
_INSTANT = {"type": "string", "format": "date-time", "nullable": True}
_STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}


def _obj(props: dict[str, Any], required: tuple[str, ...] = (), nullable: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        s["required"] = list(required)
    if nullable:
        s["nullable"] = True
    return s


JOB_DOCUMENT = _obj({
    "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"},
    "description": {"type": "string", "maxLength": 2048},
    "labels": _STRMAP,
    "schedule": {"type": "string", "description": "cron (5 or 6 fields, seconds first), @hourly, @every 30s, "
                                                  "@at <RFC 3339>, @manually"},
    "timezone": {"type": "string", "description": "IANA name, default UTC"},
    "paused": {"type": "boolean"},
    "starts_at": _INSTANT,
    "ends_at": _INSTANT,
    "executor": {"type": "string", "enum": ["http", "shell"]},
    "http": _obj({
        "url": {"type": "string"},
        "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]},
        "headers": _STRMAP,
        "body": {"type": "string", "nullable": True},
        "expect_status": {"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 599}},
        "expect_body": {"type": "string", "nullable": True},
    }, ("url",), nullable=True),
    "shell": _obj({
        "command": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
        "env": _STRMAP,
        "cwd": {"type": "string", "nullable": True},
        "limits": _obj({
            "processes": {"type": "integer", "minimum": 1, "description": "RLIMIT_NPROC (per user); default 1024 "
                                                                       "with --shell-user, else none"},
            "memory": {"oneOf": [{"type": "integer", "minimum": 1048576}, {"type": "string"}],
                       "description": "RLIMIT_DATA per process: bytes or 512Mi, 2Gi, 500M; default 1Gi"},
            "cpu": {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"}], "nullable": True,
                    "description": "RLIMIT_CPU per process: seconds or a duration; default none (timeout bounds it)"},
            "open_files": {"type": "integer", "minimum": 1, "description": "RLIMIT_NOFILE, default 1024"},
        }),
    }, ("command",), nullable=True),
    "timeout": _DURATION,
    "retries": _obj({"max": {"type": "integer", "minimum": 0, "maximum": 100}, "backoff": _DURATION,
                     "factor": {"type": "number", "minimum": 1, "maximum": 100}, "max_backoff": _DURATION}),
    "concurrency": {"type": "string", "enum": ["allow", "forbid", "replace"]},
    "delivery": {"type": "string", "enum": ["at-least-once", "at-most-once"]},
    "catchup": _obj({"policy": {"type": "string", "enum": ["none", "latest", "all"]}, "window": _DURATION}),
    "target": _obj({"tags": _STRMAP, "count": {"type": "integer", "minimum": 1, "maximum": 100}}),
    "depends_on": _obj({"job": {"type": "string"}, "on": {"type": "string", "enum": ["success", "failure", "any"]}},
                       ("job",), nullable=True),
    "alerts": _obj({
        "webhook": {"type": "string", "nullable": True},
        "on": {"type": "array", "items": {"type": "string", "enum": [
            "failure", "recovery", "missed", "dead", "late", "duration", "duplicate"]}},
        "after_failures": {"type": "integer", "minimum": 1, "maximum": 10000},
        "late_after": _DURATION,
    }),
    "history": _obj({"keep": {"type": "integer", "minimum": 1, "maximum": 10000}, "max_age": _DURATION}),
}, ("executor",))

_T = {"type": "string", "format": "date-time", "nullable": True}
_RUN = {
    "type": "object",
    "properties": {
        "id": {"type": "string"}, "job": {"type": "string"}, "slot": {"type": "string", "format": "date-time"},
        "attempt": {"type": "integer"},
        "trigger": {"type": "string", "enum": ["schedule", "catchup", "manual", "retry", "dependency", "replay"]},
        "status": {"type": "string"}, "node": {"type": "string", "nullable": True},
        "claimed_at": _T, "started_at": _T, "finished_at": _T,
        "duration_ms": {"type": "integer", "nullable": True}, "exit_code": {"type": "integer", "nullable": True},
        "http_status": {"type": "integer", "nullable": True}, "output": {"type": "string"},
        "error": {"type": "string", "nullable": True}, "fencing_token": {"type": "integer"},
    },
    "required": ["id", "job", "slot", "attempt", "trigger", "status", "fencing_token"],
}
_NODE_REF = {"type": "object", "nullable": True, "properties": {
    "node_id": {"type": "string", "nullable": True}, "raft_addr": {"type": "string"},
    "http_addr": {"type": "string", "nullable": True}}}
_MEMBER = {"type": "object", "properties": {
    "node_id": {"type": "string", "nullable": True}, "raft_addr": {"type": "string"},
    "http_addr": {"type": "string", "nullable": True}, "role": {"type": "string"},
    "reachable": {"type": "boolean"}, "lag": {"type": "integer", "nullable": True},
    "clock_offset_ms": {"type": "number", "nullable": True,
                        "description": "this member's wall clock minus the leader's, in ms; null while unknown"},
    "clock_error_ms": {"type": "number", "nullable": True,
                       "description": "bound on the error of clock_offset_ms, in ms; null while unknown"},
    "prevote": {"type": "boolean", "description": "whether this member answers pre-vote, as the answering node "
                "last heard in its keepalive (a member on an earlier release does not)"}},
    "required": ["raft_addr", "role", "reachable"]}


def _list_of(ref: str) -> dict[str, Any]:
    return {"type": "object", "required": ["items", "next_cursor"], "properties": {
        "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{ref}"}},
        "next_cursor": {"type": "string", "nullable": True}}}


COMPONENTS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message", "details"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": {"type": "array"}}}}},
    "Object": {"type": "object"},
    "Health": {"type": "object", "required": ["status"], "properties": {
        "status": {"type": "string"}, "node_id": {"type": "string"}, "caught_up": {"type": "boolean"}}},
    "Cluster": {"type": "object", "required": ["node_id", "leader", "term", "commit_index", "applied_index", "members"],
                "properties": {"node_id": {"type": "string"}, "leader": _NODE_REF, "term": {"type": "integer"},
                               "commit_index": {"type": "integer"}, "applied_index": {"type": "integer"},
                               "caught_up": {"type": "boolean"}, "members": {"type": "array", "items": _MEMBER}}},
    "ClusterHistory": {"type": "object", "required": ["node_id", "every_s", "span_s", "items"], "properties": {
        "node_id": {"type": "string"}, "every_s": {"type": "number"}, "span_s": {"type": "number"},
        "items": {"type": "array", "items": {"type": "object", "required": ["at", "commit_index", "applied_index"],
                                             "properties": {
            "at": _T, "commit_index": {"type": "integer"}, "applied_index": {"type": "integer"},
            "apply_lag": {"type": "integer"},
            "runs_ended_per_s": {"type": "number", "nullable": True}}}}}},
    "Member": _MEMBER,
    "MemberList": _list_of("Member"),
    "MemberAdd": _obj({"node_id": {"type": "string"}, "raft_addr": {"type": "string"},
                       "http_addr": {"type": "string"}}, ("raft_addr",)),
    "JobDocument": JOB_DOCUMENT,
    "Job": {"type": "object", "required": ["name", "spec", "version", "status"], "properties": {
        "name": {"type": "string"}, "spec": {"type": "object"}, "version": {"type": "integer"},
        "error": {"type": "string", "description": "why the job's next slots cannot be computed or planned"},
        "created_at": _T, "updated_at": _T, "change": {"type": "string", "enum": ["created", "configured", "unchanged"]},
        "status": {"type": "object", "properties": {
            "paused": {"type": "boolean"}, "last_run": {"type": "object", "nullable": True},
            "next_slots": {"type": "array", "items": {"type": "string"}},
            "consecutive_failures": {"type": "integer"}}},
        "recent_runs": {"type": "array", "description": "with include=recent_runs: the newest runs, newest first",
                        "items": {"type": "object", "required": ["id", "slot", "status", "attempt"], "properties": {
                            "id": {"type": "string"}, "slot": _T, "status": {"type": "string"},
                            "attempt": {"type": "integer"}, "node": {"type": "string", "nullable": True},
                            "trigger": {"type": "string"},
                            "duration_ms": {"type": "integer", "nullable": True}}}}}},
    "JobList": {**_list_of("Job"), "properties": {**_list_of("Job")["properties"], "total": {
        "type": "integer", "description": "every job of the cluster, whatever the filter"}, "failing": {
        "type": "integer", "description": "jobs whose last run failed, whatever the filter (first page only)"}}},
    "JobBatch": _obj({"mode": {"type": "string", "enum": ["create", "apply"],
                               "description": "create: refused (409) if any name exists; apply: create or replace"},
                      "jobs": {"type": "array", "maxItems": 5000,
                               "items": {"$ref": "#/components/schemas/JobDocument"}}}, ("mode", "jobs")),
    "JobBatchResult": {"type": "object", "required": ["mode", "count", "changes", "items"], "properties": {
        "mode": {"type": "string", "enum": ["create", "apply"]}, "count": {"type": "integer"},
        "changes": {"type": "object", "properties": {k: {"type": "integer"} for k in
                                                     ("created", "configured", "unchanged")}},
        "items": {"type": "array", "items": {"type": "object", "required": ["name", "change", "version"],
                                             "properties": {"name": {"type": "string"}, "version": {"type": "integer"},
                                                            "change": {"type": "string", "enum": [
                                                                "created", "configured", "unchanged"]}}}}}},
    "Run": _RUN,
    "RunList": _list_of("Run"),
    "RunAccepted": {"type": "object", "required": ["run_id"], "properties": {"run_id": {"type": "string"}}},
    "Note": _obj({"note": {"type": "string", "nullable": True}}, nullable=True),
    "Explain": {"type": "object", "required": ["decision", "reason"], "properties": {
        "slot": {"type": "string", "nullable": True}, "decision": {"type": "string"},
        "reason": {"type": "string"}, "run_id": {"type": "string", "nullable": True}}},
    "ExplainList": _list_of("Explain"),
}
