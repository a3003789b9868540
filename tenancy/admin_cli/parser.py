"""The argument tree of the REST commands under `loragate admin` (tenancy/cli.py adds them).

Handlers are named, not imported: commands.py (and with it httpx and rich) is imported when a
command runs, so `loragate admin --help` builds this tree without them (gateway/cli.py)."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
from pathlib import Path
from typing import Any

SCOPES = ("inference", "tenant-admin", "admin")
UPLOAD_EPILOG = (
    "Before sending any weights, the upload checks adapter_config.json (r and rank_pattern "
    "against the max rank, peft_type LORA, base_model_name_or_path against the served model) and "
    "the files (their number and total size) and --name's length against the server's limits: "
    "`loragate admin adapters limits` shows them (defaults: rank 64, 256 MiB, 8 files, names "
    "of 64 characters; LORAGATE_ADAPTER_LIMITS__*). The server then checks everything."
)
TENANT_HELP = "the tenant: its name or its id"


def _limit(text: str) -> int | None:
    """A limit: a count, or `unlimited`."""
    if text.lower() in ("unlimited", "none", "null"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more, or 'unlimited'")
    return value


def _amount(text: str) -> int | None:
    """A currency budget: an amount (`12.50`, at most 6 decimals) as micro-units, or `unlimited`."""
    if text.lower() in ("unlimited", "none", "null"):
        return None
    from tenancy.spend.money import to_micros  # light: decimal only

    try:
        return to_micros(text, field="amount")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _date(text: str) -> str:
    return dt.date.fromisoformat(text).isoformat()


def _when(text: str) -> str:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).isoformat()


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="the API's answer as JSON (scripts)")
    common.add_argument("--profile", default=None,
                        help="a saved profile (default: LORAGATE_ADMIN_URL/KEY, else 'default')")  # fmt: skip
    return common


def _run(handler: str, args: argparse.Namespace) -> int:
    from tenancy.admin_cli import commands

    if handler == "login":  # no saved target yet: it makes one
        return commands.login(args)
    return commands.run(getattr(commands, handler), args)


def _command(group: Any, name: str, handler: str, help: str, common: Any) -> Any:
    """`handler`: the name of a function in commands.py (tests/e2e/test_admin_cli.py runs each)."""
    parser = group.add_parser(name, help=help, description=help, parents=[common])
    parser.set_defaults(handler=functools.partial(_run, handler))
    return parser


def _tenant(parser: Any, *, optional: bool = False) -> None:
    """The one convention: TENANT is the first positional argument of every command that takes
    one. Where it is optional (an upload with --public, the audit filter), `--tenant` is kept as
    an earlier spelling; commands.tenant_of reconciles the two."""
    if optional:
        parser.add_argument("tenant", nargs="?", default=None, metavar="TENANT", help=TENANT_HELP)
        parser.add_argument("--tenant", dest="tenant_flag", default=None, metavar="TENANT",
                            help="same as the positional TENANT (earlier spelling)")  # fmt: skip
    else:
        parser.add_argument("tenant", metavar="TENANT", help=TENANT_HELP)


def add_rest_commands(admin: Any) -> None:
    common = _common()

    tenants = admin.add_parser("tenants", help="tenants").add_subparsers(dest="verb", required=True)
    _command(tenants, "list", "tenants_list", "list the tenants you may see", common)
    p = _command(tenants, "get", "tenants_get", "one tenant", common)
    _tenant(p)
    p = _command(tenants, "create", "tenants_create", "create a tenant (admin)", common)
    p.add_argument("name")
    p.add_argument("--tier", default=None, help="a tier name (default: the server's default)")
    p = _command(tenants, "update", "tenants_update", "rename, re-tier or suspend (admin)", common)
    _tenant(p)
    p.add_argument("--name")
    p.add_argument("--tier")
    p.add_argument("--status", choices=("active", "suspended"))
    p = _command(tenants, "delete", "tenants_delete", "delete a tenant (admin)", common)
    _tenant(p)
    p.add_argument("--yes", action="store_true", help="confirm")
    p = _command(tenants, "rotate-salt", "tenants_rotate_salt", "new cache-salt epoch", common)
    _tenant(p)

    keys = admin.add_parser("keys", help="API keys").add_subparsers(dest="verb", required=True)
    p = _command(keys, "list", "keys_list", "a tenant's keys (prefix and last four)", common)
    _tenant(p)
    p = _command(keys, "create", "keys_create", "create a key; prints it once", common)
    _tenant(p)
    p.add_argument("name")
    p.add_argument("--scope", action="append", choices=SCOPES,
                   help="repeat for several (default: inference)")  # fmt: skip
    p.add_argument("--expires-at", type=_when, default=None, help="ISO time (UTC if no zone)")
    p = _command(
        keys, "rotate", "keys_rotate", "a new key; the old one works for the grace", common
    )
    _tenant(p)
    p.add_argument("key_id")
    p.add_argument("--grace-seconds", type=float, default=None)
    p = _command(keys, "revoke", "keys_revoke", "revoke a key at once", common)
    _tenant(p)
    p.add_argument("key_id")

    quotas = admin.add_parser("quotas", help="quota policies and live state").add_subparsers(
        dest="verb", required=True
    )
    for verb, handler, text in (
        ("get", "quotas_get", "a tenant's (or --key's) quota policy (--model: one model's)"),
        ("list", "quotas_list", "every policy of a tenant and its keys, all-models and per model"),
        (
            "set",
            "quotas_set",
            "change the limits given, keep the others (--replace: a limit "
            "not given becomes unlimited)",
        ),
        ("state", "quotas_state", "live state from the quota store: used, remaining, resets"),
    ):
        p = _command(quotas, verb, handler, text, common)
        _tenant(p)
        if verb == "list":
            continue
        p.add_argument("--key", default=None, help="a key id: its own policy")
        if verb in ("get", "set"):
            p.add_argument("--model", default=None, metavar="NAME",
                           help="a served base model: the policy for its requests (its "
                                "adapters' included); default: the all-models policy")  # fmt: skip
        if verb == "set":
            for field, flag in (("requests_per_minute", "--rpm"), ("tokens_per_minute", "--tpm"),
                                ("max_concurrent", "--concurrent"),
                                ("daily_token_budget", "--daily-tokens"),
                                ("monthly_token_budget", "--monthly-tokens")):  # fmt: skip
                # absent when not given: `set` keeps that limit (merge) unless --replace
                p.add_argument(flag, dest=field, type=_limit, default=argparse.SUPPRESS,
                               metavar="N|unlimited")  # fmt: skip
            for field, flag in (("daily_spend_budget_micros", "--daily-spend"),
                                ("monthly_spend_budget_micros", "--monthly-spend")):  # fmt: skip
                p.add_argument(flag, dest=field, type=_amount, default=argparse.SUPPRESS,
                               metavar="AMOUNT|unlimited",
                               help="in the server's currency, e.g. 12.50")  # fmt: skip
            p.add_argument("--replace", action="store_true",
                           help="set every limit: one not given becomes unlimited")  # fmt: skip

    adapters = admin.add_parser("adapters", help="LoRA adapters").add_subparsers(
        dest="verb", required=True
    )
    p = _command(
        adapters, "list", "adapters_list", "a tenant's adapters and the public ones", common
    )
    _tenant(p)
    p = _command(adapters, "get", "adapters_get", "one adapter", common)
    _tenant(p)
    p.add_argument("adapter", help="adapter id")
    p = _command(adapters, "upload", "adapters_upload",
                 "upload a PEFT directory or a .zip/.tar.gz, with progress", common)  # fmt: skip
    p.epilog = UPLOAD_EPILOG
    _tenant(p, optional=True)
    p.add_argument("source", type=Path, metavar="DIR|ARCHIVE")
    p.add_argument("--name", required=True, help="the name clients use as `model`; a name "
                   "uploaded again becomes its next version")  # fmt: skip
    p.add_argument("--public", action="store_true", help="visible to every tenant (admin)")
    p.add_argument("--no-activate", action="store_true",
                   help="stage the new version: the name's alias stays where it is (the first "
                   "version of a name always creates it)")  # fmt: skip
    p.add_argument("--base-model", help="the served base model it is for (a gateway serving "
                   "several; default: its primary one)")  # fmt: skip
    _command(adapters, "limits", "adapters_limits", "what an upload must fit (server)", common)
    p = _command(adapters, "delete", "adapters_delete",
                 "delete an adapter version (refused while an alias serves it)", common)  # fmt: skip
    _tenant(p)
    p.add_argument("adapter")
    _alias_commands(adapters, common)

    p = _command(admin, "usage", "usage", "usage per day and model", common)
    _tenant(p)
    p.add_argument("--since", type=_date, default=None, help="YYYY-MM-DD")
    p.add_argument("--until", type=_date, default=None, help="YYYY-MM-DD")

    prices = admin.add_parser("prices", help="prices per 1M tokens").add_subparsers(
        dest="verb", required=True
    )
    _command(prices, "list", "prices_list", "every price, and the settings' defaults", common)
    p = _command(prices, "set", "prices_set", "set a model's or an adapter's price (admin)", common)
    p.add_argument("model", help="the served base model's name")
    p.add_argument("--adapter", default=None, help="an adapter id: its price overrides the model's")
    for flag, text in (
        ("--prompt", "uncached prompt tokens"),
        ("--completion", "completion tokens"),
    ):
        p.add_argument(flag, required=True, metavar="AMOUNT", help=f"{text}, per 1M, e.g. 0.15")
    p.add_argument("--cached", default=None, metavar="AMOUNT",
                   help="cached prompt tokens, per 1M (default: the prompt price)")  # fmt: skip

    p = _command(admin, "spend", "spend", "spend from the usage ledger: a tenant's total, per "
                 "key and per model; without TENANT, per tenant", common)  # fmt: skip
    _tenant(p, optional=True)
    p.add_argument("--since", type=_date, default=None, help="YYYY-MM-DD (UTC, inclusive)")
    p.add_argument("--until", type=_date, default=None, help="YYYY-MM-DD (UTC, inclusive)")

    _webhook_commands(admin, common)

    p = _command(admin, "audit", "audit", "the audit log, newest first", common)
    _tenant(p, optional=True)
    p.add_argument("--action", default=None, help="e.g. key.create")
    p.add_argument("--actor", default=None)
    p.add_argument("--since", type=_when, default=None)
    p.add_argument("--until", type=_when, default=None)
    p.add_argument("--limit", type=int, default=None)

    p = admin.add_parser("login", help="save a profile (URL and key; the key read from stdin)")
    p.add_argument("--url", required=True, help="the gateway, e.g. https://gateway.example")
    p.add_argument("--profile", default=None)
    p.set_defaults(handler=functools.partial(_run, "login"))


def _alias_commands(adapters: Any, common: Any) -> None:
    """TENANT's adapter names, or --public ones: versions and the alias (a rollback is a
    switch)."""
    for verb, handler, text in (
        ("versions", "adapters_versions", "the versions of an adapter name"),
        ("aliases", "adapters_aliases", "the aliases: the version each serves, any canary"),
        ("alias", "adapters_alias", "one alias"),
        ("switch", "adapters_switch", "point the alias at a version (also: a rollback); "
         "drops a canary"),
        ("canary", "adapters_canary", "send WEIGHT percent of the alias's requests to VERSION"),
        ("canary-clear", "adapters_canary_clear", "every request to the alias's version again"),
        ("delete-alias", "adapters_delete_alias", "delete the alias (--with-versions: and "
         "every version of the name)"),
    ):  # fmt: skip
        p = _command(adapters, verb, handler, text, common)
        _tenant(p, optional=True)
        p.add_argument("--public", action="store_true", help="a public adapter name (admin)")
        if verb != "aliases":
            p.add_argument("name", metavar="NAME", help="the adapter name")
        if verb in ("switch", "canary"):
            p.add_argument("version", metavar="VERSION", type=int, help="1, 2, ...")
        if verb == "canary":
            p.add_argument("weight", metavar="WEIGHT", type=int, help="percent, 1-99")
        if verb == "delete-alias":
            p.add_argument("--with-versions", action="store_true")
            p.add_argument("--yes", action="store_true", help="confirm --with-versions")


def _webhook_commands(admin: Any, common: Any) -> None:
    hooks = admin.add_parser("webhooks", help="budget-alert webhooks").add_subparsers(
        dest="verb", required=True
    )
    for verb, handler, text in (
        ("get", "webhooks_get", "the tenant's webhook (never its secret)"),
        ("create", "webhooks_create", "register it; prints the signing secret once"),
        ("update", "webhooks_update", "change its URL, thresholds, events or state"),
        ("delete", "webhooks_delete", "remove it"),
        ("rotate-secret", "webhooks_rotate_secret", "a new signing secret, printed once"),
        ("test", "webhooks_test", "send a webhook.test event"),
        ("deliveries", "webhooks_deliveries", "the delivery log, newest first"),
    ):
        p = _command(hooks, verb, handler, text, common)
        _tenant(p)
        if verb == "create":
            p.add_argument("url")
            p.add_argument("--disabled", action="store_true", help="registered, not sending")
        if verb == "update":
            p.add_argument("--url", default=None)
            p.add_argument("--enabled", default=None, type=lambda t: t.lower() == "true",
                           metavar="true|false")  # fmt: skip
        if verb in ("create", "update"):
            p.add_argument("--threshold", type=int, action="append", metavar="PERCENT",
                           help="repeat for several (default 50, 80, 100)")  # fmt: skip
            p.add_argument("--event", action="append",
                           choices=("budget.threshold", "outage.quota_store", "outage.engine"),
                           help="repeat for several (default: budget.threshold)")  # fmt: skip
        if verb == "deliveries":
            p.add_argument("--limit", type=int, default=50)
