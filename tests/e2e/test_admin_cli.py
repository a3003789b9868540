"""Issue 11, acceptance 4: every `loragate admin` REST command against a real `loragate serve`
process (the session's gateway). Commands run in this process through the console script's
`main` (fast); the upload also runs as the real console script, to show its progress output and
a server-side validation error reaching the user intact."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
import zipfile
from pathlib import Path

import httpx
import pytest
from admin_cli_runner import MODEL, Cli
from admin_cli_runner import adapter_dir as _adapter_dir
from gateway_process import BIN, GatewayProcess

from gateway.cli import build_parser

# The CLI speaks to the API, whatever engine serves: the embedded gateway is enough.
pytestmark = pytest.mark.parametrize("gateway_proc", ["embedded"], indirect=True)


@pytest.fixture
def cli(
    gateway_proc: GatewayProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Cli:
    monkeypatch.setenv("LORAGATE_ADMIN_URL", gateway_proc.url)
    monkeypatch.setenv("LORAGATE_ADMIN_KEY", gateway_proc.admin_key)
    monkeypatch.setenv("LORAGATE_ADMIN_PROFILES", str(tmp_path / "profiles.json"))
    monkeypatch.setenv("COLUMNS", "200")
    return Cli(gateway_proc, capsys)


def _tenant(cli: Cli, name: str) -> str:
    created = cli.json("tenants", "create", name, "--tier", "batch")
    cli.gateway.tenant_ids.append(created["id"])
    return str(created["id"])


def test_tenants(cli: Cli) -> None:
    code, out, _ = cli.run("tenants", "create", "cli-tenants", "--tier", "realtime")
    assert code == 0 and "cli-tenants" in out and "realtime" in out  # a table for people
    listed = cli.json("tenants", "list")
    tenant = next(t for t in listed if t["name"] == "cli-tenants")
    cli.gateway.tenant_ids.append(tenant["id"])
    assert cli.json("tenants", "get", tenant["id"])["tier"] == "realtime"
    assert cli.json("tenants", "get", "cli-tenants")["id"] == tenant["id"]  # a name works too
    assert (
        cli.json("tenants", "update", tenant["id"], "--status", "suspended")["status"]
        == "suspended"
    )
    assert (
        cli.json("tenants", "update", tenant["id"], "--name", "cli-renamed")["name"]
        == "cli-renamed"
    )
    assert cli.json("tenants", "rotate-salt", tenant["id"])["salt_epoch"] == 1
    code, _, err = cli.run("tenants", "delete", tenant["id"])
    assert code == 2 and "--yes" in err
    code, _, err = cli.run("tenants", "delete", tenant["id"], "--yes")
    assert code == 0 and "deleted" in err
    code, _, err = cli.run("tenants", "get", tenant["id"])
    assert code == 1 and "HTTP 404" in err and "not_found" in err


def test_keys(cli: Cli) -> None:
    tenant = _tenant(cli, "cli-keys")
    code, out, err = cli.run("keys", "create", tenant, "ci", "--scope", "inference",
                             "--expires-at", "2099-01-01T00:00:00")  # fmt: skip
    assert code == 0 and "shown once" in err
    key = out.strip()
    assert out == key + "\n"  # the key alone on stdout: `key=$(loragate admin keys create ...)`
    assert "last 4" in err  # the key's record, for the person, on stderr
    cli.gateway.secrets.append(key)
    assert key.startswith("lg_") and len(key) > 40
    r = httpx.get(cli.gateway.base_url + "/models", headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200  # the printed key works
    listed = cli.json("keys", "list", tenant)
    assert [k["name"] for k in listed] == ["ci"] and key not in json.dumps(listed)
    assert listed[0]["expires_at"].startswith("2099-01-01")
    code, out, _ = cli.run("keys", "list", tenant)
    assert listed[0]["last_four"] in out and key not in out
    rotated = cli.json("keys", "rotate", tenant, listed[0]["id"], "--grace-seconds", "0")
    cli.gateway.secrets.append(rotated["key"])
    assert rotated["key"] != key
    revoked = cli.json("keys", "revoke", tenant, rotated["id"])
    assert revoked["revoked_at"] is not None


def test_quotas(cli: Cli) -> None:
    tenant = _tenant(cli, "cli-quotas")
    policy = cli.json("quotas", "set", tenant, "--rpm", "5", "--daily-tokens", "1000",
                      "--concurrent", "unlimited")  # fmt: skip
    assert policy["requests_per_minute"] == 5 and policy["daily_token_budget"] == 1000
    assert policy["max_concurrent"] is None
    assert cli.json("quotas", "get", tenant) == policy
    # a limit not given keeps its value (it became unlimited before)
    merged = cli.json("quotas", "set", tenant, "--tpm", "100")
    assert (merged["requests_per_minute"], merged["daily_token_budget"]) == (5, 1000)
    assert merged["tokens_per_minute"] == 100
    replaced = cli.json("quotas", "set", tenant, "--replace", "--rpm", "5", "--daily-tokens",
                        "1000")  # fmt: skip
    assert replaced == policy
    key = cli.json("keys", "create", tenant, "app")
    cli.gateway.secrets.append(key["key"])
    key_policy = cli.json("quotas", "set", tenant, "--key", key["id"], "--rpm", "3")
    assert key_policy["api_key_id"] == key["id"] and key_policy["requests_per_minute"] == 3
    r = httpx.post(
        cli.gateway.base_url + "/chat/completions",
        headers={"authorization": f"Bearer {key['key']}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    state = cli.json("quotas", "state", tenant)
    api = cli.gateway.admin("GET", f"/tenants/{tenant}/quota-state").json()
    assert [row["used"] for row in state["limits"]] == [row["used"] for row in api["limits"]]
    assert state["limits"][0] == {**api["limits"][0], "resets_in_s": state["limits"][0][
        "resets_in_s"], "resets_at": state["limits"][0]["resets_at"]}  # fmt: skip
    assert cli.json("quotas", "state", tenant, "--key", key["id"])["has_own_policy"]
    code, out, _ = cli.run("quotas", "state", tenant)
    assert code == 0 and "requests_per_minute" in out and "1,000" in out
    # seconds to a reset to a tenth, never a raw float's 15 digits
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert rows and not any(re.search(r"\d\.\d{3,}", row) for row in rows), out
    per_model = cli.json("quotas", "set", tenant, "--model", MODEL, "--rpm", "50")
    assert per_model["model"] == MODEL and per_model in cli.json("quotas", "list", tenant)


def test_adapters(cli: Cli, tiny_model_dir: Path, tmp_path: Path) -> None:
    tenant = _tenant(cli, "cli-adapters")
    source = _adapter_dir(tiny_model_dir, tmp_path / "peft")
    # TENANT first, as every command takes it; `--tenant` is the earlier spelling, still taken
    created = cli.json("adapters", "upload", tenant, str(source), "--name", "from-dir")
    assert created["name"] == "from-dir" and created["owner_tenant_id"] == tenant
    archive = tmp_path / "peft.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in source.iterdir():
            z.write(path, path.name)
    zipped = cli.json("adapters", "upload", str(archive), "--tenant", tenant, "--name", "from-zip")
    assert zipped["sha256"] == created["sha256"]  # the same files, either way
    names = {a["name"] for a in cli.json("adapters", "list", tenant)}
    assert {"from-dir", "from-zip"} <= names
    assert cli.json("adapters", "get", tenant, created["id"])["rank"] == created["rank"]
    code, _, err = cli.run("adapters", "delete", tenant, zipped["id"])
    assert code == 0 and "deleted" in err
    assert "from-zip" not in {a["name"] for a in cli.json("adapters", "list", tenant)}
    code, _, err = cli.run("adapters", "upload", str(source), "--name", "x")
    assert code == 2 and "TENANT, or --public" in err
    limits = cli.json("adapters", "limits")
    assert limits == cli.gateway.admin("GET", "/adapters/limits").json()
    rank, length = limits["max_rank"] + 1, limits["max_name_length"] + 1
    assert limits["base_model"] == MODEL and "q_proj" in limits["target_modules"]
    code, out, _ = cli.run("adapters", "limits")
    assert code == 0 and "max rank" in out
    # --base-model: one the server serves (here its one model), else refused before sending
    on_base = cli.json("adapters", "upload", tenant, str(source), "--name", "on-base",
                       "--base-model", MODEL)  # fmt: skip
    assert on_base["base_model"] == MODEL and limits["base_models"] == [MODEL]
    code, _, err = cli.run("adapters", "upload", tenant, str(source), "--name", "y",
                           "--base-model", "huge")  # fmt: skip
    assert code == 2 and "--base-model 'huge' is not served" in err
    odd = _adapter_dir(tiny_model_dir, tmp_path / "odd", rank_pattern={"q_proj": rank},
                       base_model_name_or_path="other/model")  # fmt: skip
    code, _, err = cli.run("adapters", "upload", tenant, str(odd), "--name", "n" * length)
    assert code == 2 and f"rank_pattern['q_proj'] is {rank}" in err and "'other/model'" in err
    assert f"--name is {length} characters, above {length - 1}" in err
    code, _, err = cli.run("adapters", "upload", tenant, str(source), "--tenant", "other",
                           "--name", "x")  # fmt: skip
    assert code == 2 and "TENANT given twice" in err


def test_adapter_versions_and_aliases(cli: Cli, tiny_model_dir: Path, tmp_path: Path) -> None:
    tenant = _tenant(cli, "cli-versions")
    source = _adapter_dir(tiny_model_dir, tmp_path / "peft")
    v1 = cli.json("adapters", "upload", tenant, str(source), "--name", "support")
    v2 = cli.json("adapters", "upload", tenant, str(source), "--name", "support", "--no-activate")
    assert (v1["version"], v2["version"]) == (1, 2) and v1["id"] != v2["id"]
    assert [v["version"] for v in cli.json("adapters", "versions", tenant, "support")] == [1, 2]
    assert cli.json("adapters", "alias", tenant, "support")["version"] == 1  # v2 was staged
    assert cli.json("adapters", "switch", tenant, "support", "2")["version"] == 2
    canary = cli.json("adapters", "canary", tenant, "support", "1", "10")
    assert (canary["version"], canary["canary_version"], canary["canary_weight"]) == (2, 1, 10)
    code, _, err = cli.run("adapters", "delete", tenant, v1["id"])
    assert code == 1 and "alias 'support'" in err and "its canary" in err
    assert cli.json("adapters", "canary-clear", tenant, "support")["canary_version"] is None
    code, _, err = cli.run("adapters", "switch", tenant, "support", "1")  # a rollback
    assert code == 0 and "now serves version 1" in err
    listed = cli.json("adapters", "aliases", tenant)
    assert [(a["name"], a["version"]) for a in listed if a["name"] == "support"] == [("support", 1)]
    assert isinstance(cli.json("adapters", "aliases", "--public"), list)
    code, _, err = cli.run("adapters", "alias", "support")  # neither TENANT nor --public
    assert code == 2 and "TENANT, or --public" in err
    code, _, err = cli.run("adapters", "delete-alias", tenant, "support", "--with-versions")
    assert code == 2 and "--yes" in err
    code, _, err = cli.run(
        "adapters", "delete-alias", tenant, "support", "--with-versions", "--yes"
    )
    assert code == 0 and "every version" in err
    assert cli.json("adapters", "versions", tenant, "support") == []


def test_upload_progress_and_server_validation_error(
    gateway_proc: GatewayProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The real console script: the progress bar on stderr, and the server's refusal as it is."""
    env = {**os.environ, "LORAGATE_ADMIN_URL": gateway_proc.url,
           "LORAGATE_ADMIN_KEY": gateway_proc.admin_key, "COLUMNS": "120"}  # fmt: skip
    tenant = gateway_proc.tenant().tenant_id
    good = _adapter_dir(tiny_model_dir, tmp_path / "good")
    done = subprocess.run(
        [str(BIN / "loragate"), "admin", "adapters", "upload", tenant, str(good),
         "--name", "progress-demo"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    print("stderr of a good upload:\n" + done.stderr)
    assert done.returncode == 0, done.stderr
    size = sum(p.stat().st_size for p in good.iterdir())
    assert "upload good (2 files)" in done.stderr
    assert "━" in done.stderr  # the bar
    sent = re.search(r"([\d.]+)/([\d.]+) ([kM]B)", done.stderr)  # bytes sent / body size
    assert sent is not None and sent.group(1) == sent.group(2)  # all of it
    unit = {"kB": 1e3, "MB": 1e6}[sent.group(3)]
    assert abs(float(sent.group(2)) * unit - size) / size < 0.1  # the files, plus the framing
    assert "progress-demo" in done.stdout

    wide = _adapter_dir(tiny_model_dir, tmp_path / "wide", r=4096, lora_alpha=8192)
    done = subprocess.run(
        [str(BIN / "loragate"), "admin", "adapters", "upload", tenant, str(wide), "--name", "w"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr  # refused here, against GET /adapters/limits
    max_rank = gateway_proc.admin("GET", "/adapters/limits").json()["max_rank"]
    assert f"adapter_config.json: r is 4096, above this server's max rank {max_rank}" in done.stderr
    assert "nothing was sent" in done.stderr and "━" not in done.stderr  # no upload began

    bad = _adapter_dir(tiny_model_dir, tmp_path / "bad", use_dora=True)  # the server's to refuse
    files = [("files", (p.name, p.read_bytes())) for p in sorted(bad.iterdir())]
    direct = gateway_proc.admin("POST", f"/tenants/{tenant}/adapters",
                                data={"name": "too-wide"}, files=files)  # fmt: skip
    assert direct.status_code == 400
    server = direct.json()["error"]
    done = subprocess.run(
        [str(BIN / "loragate"), "admin", "adapters", "upload", str(bad), "--tenant", tenant,
         "--name", "too-wide"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    print("stderr of a refused upload:\n" + done.stderr)
    assert done.returncode == 1
    assert server["message"] in done.stderr  # the server's own words
    assert f"HTTP 400, {server['code']}" in done.stderr
    if server["param"]:
        assert f"(field: {server['param']})" in done.stderr


def test_usage_and_audit(cli: Cli) -> None:
    info = cli.gateway.tenant()
    r = httpx.post(
        cli.gateway.base_url + "/chat/completions",
        headers={"authorization": f"Bearer {info.key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 200
    for _ in range(100):  # the usage writer flushes every 50 ms in these tests
        rows = cli.json("usage", info.tenant_id)
        if rows:
            break
    assert rows[0]["num_requests"] == 1 and rows[0]["model"] == MODEL
    assert cli.json("usage", info.tenant_id, "--since", "2000-01-01", "--until", "2000-01-02") == []
    events = cli.json("audit", info.tenant_id, "--action", "tenant.create")
    assert [e["object_id"] for e in events] == [info.tenant_id]
    assert cli.json("audit", "--tenant", info.tenant_id, "--action", "tenant.create") == events
    assert len(cli.json("audit", "--limit", "2")) == 2
    code, out, _ = cli.run("audit", "--tenant", info.tenant_id)
    assert code == 0 and "key.create" in out


def test_prices_spend_and_currency_budgets(cli: Cli) -> None:
    """tests/e2e/test_spend.py checks the amounts against the ledger; here, each command runs."""
    tenant = _tenant(cli, "cli-spend")
    price = cli.json("prices", "set", MODEL, "--prompt", "0.5", "--completion", "1.25")
    assert (price["prompt"], price["cached"], price["completion"]) == (
        "0.500000",
        "0.500000",
        "1.250000",
    )
    assert price in cli.json("prices", "list")
    code, _, err = cli.run("prices", "set", MODEL, "--prompt", "0.0000001", "--completion", "1")
    assert code == 1 and "prompt" in err and "6 decimal places" in err
    policy = cli.json("quotas", "set", tenant, "--daily-spend", "12.5", "--monthly-spend", "100")
    assert (policy["daily_spend_budget_micros"], policy["monthly_spend_budget_micros"]) == (
        12_500_000, 100_000_000)  # fmt: skip
    assert cli.json("spend", tenant)["total"]["cost"] == "0.000000"
    assert any(row["tenant_id"] is not None for row in cli.json("spend"))
    code, out, _ = cli.run("spend", tenant)
    assert code == 0 and "per model" in out


def test_webhooks(cli: Cli) -> None:
    tenant, url = _tenant(cli, "cli-hooks"), "https://93.184.216.34/hook"  # public: allowed
    code, out, err = cli.run("webhooks", "create", tenant, url, "--threshold", "75")
    assert code == 0 and out.startswith("whsec_") and "75" in err  # the secret alone on stdout
    assert cli.json("webhooks", "update", tenant, "--event", "outage.engine")["thresholds"] == [75]
    assert cli.json("webhooks", "get", tenant)["events"] == ["outage.engine"]
    assert cli.json("webhooks", "rotate-secret", tenant)["secret"] != out.strip()
    sent = cli.json("webhooks", "test", tenant)["delivery_id"]
    assert sent in [d["id"] for d in cli.json("webhooks", "deliveries", tenant)]
    code, _, err = cli.run("webhooks", "update", tenant, "--url", "http://169.254.169.254/")
    assert code == 1 and "(field: url)" in err
    assert cli.run("webhooks", "delete", tenant)[0] == 0
    assert cli.run("webhooks", "get", tenant)[0] == 1


def test_tenant_names(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """TENANT is a name or an id everywhere; a tenant admin resolves its own name only."""
    mine, other = _tenant(cli, "cli-names-mine"), _tenant(cli, "cli-names-other")
    key = cli.json("keys", "create", "cli-names-mine", "ops", "--scope", "tenant-admin")
    cli.gateway.secrets.append(key["key"])
    assert cli.json("quotas", "set", "cli-names-mine", "--rpm", "7")["tenant_id"] == mine
    events = cli.json("audit", "cli-names-mine", "--action", "key.create")
    assert [e["tenant_id"] for e in events] == [mine]
    code, _, err = cli.run("keys", "list", "no-such-tenant")
    assert code == 1 and "TENANT 'no-such-tenant': no tenant of that name" in err
    monkeypatch.setenv("LORAGATE_ADMIN_KEY", key["key"])
    assert [k["id"] for k in cli.json("keys", "list", "cli-names-mine")] == [key["id"]]
    code, _, err = cli.run("keys", "list", "cli-names-other")
    assert code == 1 and "TENANT 'cli-names-other'" in err and other not in err


def test_errors_name_the_field(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = cli.run("tenants", "create", "not a valid name!")
    assert code == 1 and "(field: name)" in err and "HTTP 400, invalid_value" in err
    code, _, err = cli.run("quotas", "set", "x", "--rpm", "-3")
    assert code == 2 and "--rpm" in err  # refused before any call, naming the flag
    monkeypatch.setenv("LORAGATE_ADMIN_KEY", "lg_" + "A" * 49)
    code, _, err = cli.run("tenants", "list")
    assert code == 1 and "HTTP 401, invalid_api_key" in err
    monkeypatch.delenv("LORAGATE_ADMIN_KEY")
    code, _, err = cli.run("tenants", "list")
    assert code == 2 and "LORAGATE_ADMIN_KEY" in err
    monkeypatch.setenv("LORAGATE_ADMIN_KEY", cli.gateway.admin_key)
    monkeypatch.setenv("LORAGATE_ADMIN_URL", "http://127.0.0.1:9")
    code, _, err = cli.run("tenants", "list")
    assert code == 1 and "cannot reach http://127.0.0.1:9" in err


def test_login_saves_a_private_profile(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LORAGATE_ADMIN_KEY")
    monkeypatch.delenv("LORAGATE_ADMIN_URL")
    code, _, err = cli.run("login", "--url", cli.gateway.url, "--profile", "prod",
                           stdin="lg_" + "B" * 49 + "\n")  # fmt: skip
    assert code == 1 and "HTTP 401" in err  # a key that does not work is not saved
    code, _, err = cli.run("login", "--url", cli.gateway.url, "--profile", "prod",
                           stdin=cli.gateway.admin_key + "\n")  # fmt: skip
    assert code == 0, err
    path = Path(os.environ["LORAGATE_ADMIN_PROFILES"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert cli.json("tenants", "list", "--profile", "prod")
    path.chmod(0o644)
    code, _, err = cli.run("tenants", "list", "--profile", "prod")
    assert code == 2 and "chmod 600" in err


# On the database, not the REST API: tests/tenancy/auth/test_bootstrap_cli.py and the demo run them.
DATABASE_COMMANDS = {"migrate", "bootstrap"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found[0].choices) if found else {}


def test_every_command_has_a_test_here(gateway_proc: GatewayProcess) -> None:
    """The commands from the console script's own parser; each is run by a test in this module
    (through `cli.run`/`cli.json` or the console script), so a new one cannot go untested.
    (`gateway_proc`: the module's parametrization names it; this test reads only source.)"""
    source = Path(__file__).read_text()
    admin = _subcommands(build_parser())["admin"]
    commands: list[tuple[str, ...]] = []
    for name, parser in _subcommands(admin).items():
        verbs = _subcommands(parser)
        commands += [(name, verb) for verb in verbs] or [(name,)]
    assert ("adapters", "upload") in commands and ("login",) in commands  # the walk found them
    untested = []
    for command in commands:
        if command[0] in DATABASE_COMMANDS:
            continue
        words = r",\s*".join(f'"{w}"' for w in command)
        if not re.search(rf'(\(|"admin",)\s*{words}\s*[,)]', source):
            untested.append(" ".join(command))
    assert not untested, f"admin commands no test here runs: {untested}"
