// The tenant page's live quota state: polls the quota-state endpoint every 5 s and updates the
// numbers in place. Without JavaScript the page shows the state as of its loading.
"use strict";
(function () {
  var cont = document.getElementById("continue");
  if (cont) { window.location.replace(cont.getAttribute("href")); return; }
  var live = document.getElementById("live");
  if (!live) return;
  var url = live.getAttribute("data-url");
  var status = document.getElementById("live-status");
  var fmt = function (n) { return n === null ? "∞" : n.toLocaleString("en-US"); };
  var duration = function (s) {
    if (s === null) return "—";
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
    if (s < 172800) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " days";
  };
  function render(state) {
    state.limits.forEach(function (l) {
      var row = live.querySelector('tr[data-limit="' + l.name + '"]');
      if (!row) return;
      row.querySelector('[data-field="used"]').textContent = l.used.toLocaleString("en-US");
      row.querySelector('[data-field="limit"]').textContent = fmt(l.limit);
      row.querySelector('[data-field="remaining"]').textContent = fmt(l.remaining);
      if (l.name !== "max_concurrent") {
        row.querySelector('[data-field="resets"]').textContent = duration(l.resets_in_s);
      }
      var fg = row.querySelector(".bar-fg");
      if (fg && l.limit) {
        var frac = Math.min(l.used / l.limit, 1);
        fg.setAttribute("width", (frac * 100).toFixed(2));
        fg.setAttribute("class", "bar-fg" + (frac >= 0.9 ? " bar-hot" : frac >= 0.7 ? " bar-warm" : ""));
      }
    });
    var list = document.getElementById("rejections");
    var reasons = Object.keys(state.rejections_last_hour).sort();
    list.textContent = "";
    if (!reasons.length) {
      var none = document.createElement("li"); none.className = "muted"; none.textContent = "None.";
      list.appendChild(none);
    }
    reasons.forEach(function (r) {
      var li = document.createElement("li"); li.setAttribute("data-reason", r);
      var code = document.createElement("code"); code.textContent = r;
      var n = document.createElement("span");
      n.textContent = state.rejections_last_hour[r].toLocaleString("en-US");
      li.appendChild(code); li.appendChild(document.createTextNode(": ")); li.appendChild(n);
      list.appendChild(li);
    });
    var asOf = document.getElementById("as-of");
    asOf.setAttribute("datetime", state.as_of);
    asOf.textContent = state.as_of.substring(11, 19);
    live.setAttribute("data-refreshed", state.as_of);
  }
  function poll() {
    fetch(url, { credentials: "same-origin", redirect: "manual", headers: { accept: "application/json" } })
      .then(function (r) {
        if (r.status !== 200) throw new Error("session");
        return r.json();
      })
      .then(function (state) { render(state); status.textContent = ""; setTimeout(poll, 5000); })
      .catch(function () { status.textContent = "Live updates stopped: reload the page (your session may have ended)."; });
  }
  setTimeout(poll, 5000);
})();
