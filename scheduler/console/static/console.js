// mq-scheduler console: the only script, loaded from this origin (the CSP runs nothing else).
// It refreshes the parts of a page marked data-refresh (the overview) every few seconds while
// the tab is visible, and lets the user pause that. Everything works without it.
(function () {
  "use strict";

  function start(region) {
    var seconds = Number(region.getAttribute("data-refresh")) || 5;
    var url = region.getAttribute("data-refresh-url") || window.location.pathname;
    var toggle = document.querySelector("[data-refresh-toggle]");
    var paused = false;
    var busy = false;

    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () {
        paused = !paused;
        toggle.setAttribute("aria-pressed", paused ? "true" : "false");
        toggle.textContent = paused ? "Resume auto-refresh" : "Pause auto-refresh";
      });
    }

    function refresh() {
      if (paused || busy || document.visibilityState !== "visible") return;
      busy = true;
      fetch(url, { headers: { "X-Console-Fragment": "1" }, credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (response.status === 401) { window.location.reload(); return null; }
          return response.ok ? response.text() : null;
        })
        .then(function (html) {
          // The server renders this part with every value escaped, as it renders the page.
          if (html !== null && html !== undefined) region.innerHTML = html;
        })
        .catch(function () { /* the daemon is away: keep what is shown, try again later */ })
        .then(function () { busy = false; });
    }

    window.setInterval(refresh, seconds * 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var regions = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < regions.length; i++) start(regions[i]);
  });
})();
