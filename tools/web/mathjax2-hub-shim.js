/* Loaded before the widget embed bundle (see _config.yml, nb_ipywidgets_js).
   @jupyter-widgets/controls typesets widget labels with MathJax 2's API,
   MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]); this site runs MathJax 3,
   which has no Hub. Give it a minimal Hub that forwards to typesetPromise. */
(function () {
  function install() {
    var MJ = window.MathJax;
    if (!MJ || MJ.Hub || !MJ.startup) return;
    MJ.Hub = {
      Queue: function (job) {
        var el = Array.isArray(job) ? job[2] : undefined;
        var start = MJ.startup.promise || Promise.resolve();
        MJ.startup.promise = start.then(function () {
          return MJ.typesetPromise ? MJ.typesetPromise(el ? [el] : undefined) : null;
        });
        return MJ.startup.promise;
      }
    };
  }
  // Deferred scripts (MathJax among them) have run by DOMContentLoaded; widgets render on load.
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", install);
  } else {
    install();
  }
  window.addEventListener("load", install);
})();
