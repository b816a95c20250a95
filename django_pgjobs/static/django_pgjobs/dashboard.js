// The dashboard's refresh: every few seconds (as the page's select says: off, 5 s, 30 s;
// the choice is kept in this browser), while the tab is visible, fetch the JSON view for
// the span, queue and kind the page shows and put its rendered fragments in place; a
// change of span, queue or kind shows the page for it. No build step, no library.
(function () {
  "use strict";
  var root = document.getElementById("pgjobs-dashboard");
  if (!root) return;
  var url = root.dataset.url;  // the JSON of what this page shows (its query included)
  var every = Math.max(1, Number(root.dataset.every) || 5) * 1000;
  var chooser = document.getElementById("pgjobs-every");
  var KEPT = "pgjobs.dashboard.every";
  var said = document.getElementById("pgjobs-refreshed");
  var timer = null;
  var parts = {
    warnings: "pgjobs-warnings",
    queues: "pgjobs-queues",
    workers: "pgjobs-workers",
    kinds: "pgjobs-kinds",
    throughput: "pgjobs-chart-throughput",
    latency: "pgjobs-chart-latency"
  };
  var scope = document.getElementById("pgjobs-scope");
  if (scope) {
    scope.querySelectorAll("select").forEach(function (select) {
      select.addEventListener("change", function () { scope.submit(); });
    });
  }

  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (data) {
        Object.keys(parts).forEach(function (name) {
          var element = document.getElementById(parts[name]);
          if (element && data.html[name] !== undefined) element.innerHTML = data.html[name];
        });
        root.dataset.refreshedAt = data.at;
        said.textContent = "Updated at " + new Date().toLocaleTimeString() + ".";
      })
      .catch(function (error) {
        said.textContent = "Could not refresh (" + error.message + "); trying again.";
      });
  }

  function start() {
    if (timer === null && every > 0) timer = window.setInterval(refresh, every);
  }

  if (chooser) {
    var kept = null;
    try { kept = window.localStorage.getItem(KEPT); } catch (error) { kept = null; }
    if (kept !== null && chooser.querySelector('option[value="' + kept + '"]')) {
      chooser.value = kept;
    }
    every = Number(chooser.value) * 1000;
    chooser.addEventListener("change", function () {
      every = Number(chooser.value) * 1000;
      try { window.localStorage.setItem(KEPT, chooser.value); } catch (error) { /* private mode */ }
      stop();
      if (every > 0) { refresh(); start(); }
      said.textContent = every > 0 ? "" : "Refresh is off.";
    });
  }

  function stop() {
    if (timer !== null) window.clearInterval(timer);
    timer = null;
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      stop();
    } else if (every > 0) {
      refresh();
      start();
    }
  });
  if (!document.hidden) start();
})();
