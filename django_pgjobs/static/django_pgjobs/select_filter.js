// A list filter shown as a select (select_filter.html): choosing a value opens the list
// filtered on it, as the filter's links do.
(function () {
  "use strict";
  document.querySelectorAll("select.pgjobs-select-filter").forEach(function (select) {
    if (select.dataset.bound) return;
    select.dataset.bound = "1";
    select.addEventListener("change", function () {
      window.location.href = select.value;
    });
  });
})();
