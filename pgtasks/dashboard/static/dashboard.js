// Live updates: every page polls its JSON twin (data-api on <body>) and redraws its tables.
// Everything is written with textContent, never as HTML.
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var body = document.body;
  // Set when the dashboard has no token: nothing can be changed, so no button is enabled.
  var readOnly = body.getAttribute("data-readonly");

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function td(value, cls) {
    var attrs = { text: value === null || value === undefined ? "" : String(value) };
    if (cls) attrs["class"] = cls;
    return el("td", attrs);
  }

  function cell(children, cls) {
    return el("td", cls ? { "class": cls } : {}, children);
  }

  function dt(iso) {
    if (!iso) return "-";
    var d = new Date(iso);
    if (isNaN(d.getTime())) return String(iso);
    return d.toISOString().slice(0, 19).replace("T", " ");
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "-";
    var s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + "m" + pad(s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + pad(Math.floor((s % 3600) / 60)) + "m";
    return Math.floor(s / 86400) + "d" + pad(Math.floor((s % 86400) / 3600)) + "h";
  }

  function firstline(text, width) {
    if (!text) return "";
    var line = String(text).trim().split("\n")[0];
    width = width || 120;
    return line.length <= width ? line : line.slice(0, width - 1) + "\u2026";
  }

  function taskLink(id) {
    return el("a", { href: "/tasks/" + encodeURIComponent(id), text: id });
  }

  function statusBadge(status) {
    return el("span", { "class": "status status-" + String(status).toLowerCase(), text: status });
  }

  function fill(id, rows, makeRow) {
    var tbody = document.getElementById(id);
    if (!tbody) return;
    var columns = tbody.closest("table").querySelectorAll("thead th").length;
    var fresh = document.createDocumentFragment();
    if (!rows.length) {
      fresh.appendChild(el("tr", { "class": "empty" }, [
        el("td", { colspan: String(columns), text: tbody.getAttribute("data-empty") || "" })
      ]));
    }
    rows.forEach(function (row) { fresh.appendChild(makeRow(row)); });
    tbody.replaceChildren(fresh);
  }

  function lookup(data, path) {
    return path.split(".").reduce(function (v, key) {
      return v === null || v === undefined ? v : v[key];
    }, data);
  }

  function fields(data) {
    document.querySelectorAll("[data-field]").forEach(function (node) {
      var value = lookup(data, node.getAttribute("data-field"));
      if (value === undefined) return;
      if (node.getAttribute("data-format") === "dt") value = dt(value);
      else if (value === null || value === "") value = "-";
      node.textContent = String(value);
    });
  }

  function chart(series) {
    var svg = document.getElementById("throughput");
    if (!svg) return;
    var height = 120, width = 600;
    var top = Math.max.apply(null, series.map(function (p) { return p.total; }).concat([1]));
    var step = width / Math.max(series.length, 1);
    var fresh = document.createDocumentFragment();
    series.forEach(function (point, i) {
      var y = height;
      ["completed", "failed", "other"].forEach(function (kind) {
        var h = point[kind] * height / top;
        if (h <= 0) return;
        y -= h;
        var rect = document.createElementNS(SVG, "rect");
        rect.setAttribute("class", "bar-" + kind);
        rect.setAttribute("x", String(i * step + 1));
        rect.setAttribute("y", String(y));
        rect.setAttribute("width", String(Math.max(step - 2, 1)));
        rect.setAttribute("height", String(h));
        var title = document.createElementNS(SVG, "title");
        title.textContent = dt(point.minute).slice(11, 16) + " UTC: " + point[kind] + " " + kind;
        rect.appendChild(title);
        fresh.appendChild(rect);
      });
    });
    svg.replaceChildren(fresh);
  }

  var pages = {
    overview: function (data) {
      fields(data);
      chart(data.throughput);
      fill("workers", data.workers, function (w) {
        return el("tr", {}, [td(w.id), td(w.host), td(w.pid), td(w.queues.join(", ")),
          td(w.concurrency, "num"), td(w.tasks, "num"), td(age(w.uptime)), td(dt(w.heartbeat_at))]);
      });
      fill("failures", data.recent_failures, function (t) {
        return el("tr", {}, [cell([taskLink(t.id)]), td(t.name), td(t.queue),
          td(firstline(t.error), "error"), td(dt(t.updated_at))]);
      });
    },
    queues: function (data) {
      fill("queues", data.queues, function (r) {
        var link = el("a", { href: "/tasks?queue=" + encodeURIComponent(r.queue), text: r.queue });
        return el("tr", {}, [cell([link]), td(r.pending_due, "num"), td(r.scheduled, "num"),
          td(r.running, "num"), td(r.expired_leases, "num"), td(r.dead, "num"),
          td(r.completed, "num"), td(r.failed, "num"), td(r.cancelled, "num"),
          td(age(r.oldest_due_age)), td(Number(r.throughput).toFixed(1), "num")]);
      });
    },
    tasks: function (data) {
      fill("tasks", data.tasks, function (t) {
        var retries = String(t.retries) + (t.max_retries === null ? "" : "/" + t.max_retries);
        return el("tr", {}, [cell([taskLink(t.id)]), td(t.name), td(t.queue),
          cell([statusBadge(t.status)]), td(t.attempt, "num"), td(retries, "num"),
          td(dt(t.run_at)), td(t.claimed_by || ""), td(firstline(t.error, 80), "error"),
          td(dt(t.updated_at))]);
      });
    },
    task: function (data) {
      fields(data);
      fill("attempts", data.attempts, function (a) {
        return el("tr", {}, [td(a.attempt, "num"), td(a.outcome), td(a.worker),
          td(dt(a.started_at)), td(dt(a.finished_at)), td(firstline(a.error), "error")]);
      });
    },
    "dead-letters": function (data) {
      var checked = {};
      document.querySelectorAll("#dead-letters input[name=ids]:checked").forEach(function (box) {
        checked[box.value] = true;
      });
      fill("dead-letters", data.dead_letters, function (d) {
        var box = el("input", { type: "checkbox", name: "ids", value: d.id, "aria-label": "Select" });
        box.checked = !!checked[d.id];
        var requeue = el("button", { type: "submit", name: "requeue_one", value: d.id, text: "Requeue" });
        var discard = el("button", { type: "submit", name: "discard_one", value: d.id, "class": "danger",
          "data-confirm": "Discard dead letter " + d.id + " of task " + d.name + "? This cannot be undone.",
          text: "Discard" });
        if (readOnly !== null) {
          [box, requeue, discard].forEach(function (node) { node.disabled = true; });
        }
        return el("tr", { "data-id": d.id }, [cell([box]), cell([taskLink(d.id)]), td(d.name), td(d.queue),
          td(d.attempt, "num"), td(d.retries, "num"), td(dt(d.updated_at)),
          td(firstline(d.error, 80), "error"), cell([requeue, " ", discard], "row-actions")]);
      });
    },
    schedules: function (data) {
      fill("schedules", data.entries, function (e) {
        var link = el("a", { href: "/tasks?name=" + encodeURIComponent(e.task), text: e.task });
        return el("tr", {}, [td(e.name), cell([link]), cell([el("code", { text: e.schedule })]),
          td(dt(e.last_tick)), td(dt(e.next_tick)), td(e.missed),
          cell([el("code", { text: e.args + " " + e.kwargs })]), cell([el("code", { text: e.options })])]);
      });
    }
  };

  // Buttons that delete or touch everything ask first.
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var question = button && button.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  var selectAll = document.getElementById("select-all");
  if (selectAll) {
    selectAll.addEventListener("change", function () {
      document.querySelectorAll("#dead-letters input[name=ids]").forEach(function (box) {
        box.checked = selectAll.checked;
      });
    });
  }

  var api = body.getAttribute("data-api");
  var render = pages[body.getAttribute("data-page")];
  var live = document.getElementById("live");
  if (!api || !render) return;
  var every = Number(body.getAttribute("data-poll")) || 3000;

  function say(text, offline) {
    if (!live) return;
    live.textContent = text;
    live.classList.toggle("offline", offline);
  }

  function poll() {
    if (document.hidden) { setTimeout(poll, every); return; }
    fetch(api, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) {
        if (response.status === 401) throw new Error("log in again");
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (data) {
        render(data);
        say("live \u00b7 " + new Date().toISOString().slice(11, 19) + " UTC", false);
      })
      .catch(function (error) { say("offline: " + error.message, true); })
      .then(function () { setTimeout(poll, every); });
  }

  setTimeout(poll, every);
})();
