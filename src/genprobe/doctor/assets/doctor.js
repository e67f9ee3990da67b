// The doctor page has no computation of its own: it marks itself ready and lets findings filter by severity.
(function () {
  "use strict";
  function filter(sev) {
    document.querySelectorAll("#findings tbody tr").forEach(function (row) {
      row.style.display = sev === "all" || row.dataset.severity === sev ? "" : "none";
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var select = document.getElementById("severity-filter");
    if (select) {
      select.addEventListener("change", function () { filter(select.value); });
    }
    document.body.dataset.ready = "1";
  });
})();
